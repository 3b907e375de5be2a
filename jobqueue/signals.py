"""What the job queue tells the apps above it, which it never imports.

``job_ended`` is sent inside the transaction that gives a job its final state, with
``job`` (its row as saved). A receiver that acts on the end registers its work with
``transaction.on_commit``; receivers run in the order they connected, after the
scheduling pass the end asked for.
"""

from __future__ import annotations

from django.dispatch import Signal

job_ended = Signal()

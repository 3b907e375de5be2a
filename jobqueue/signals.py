"""What the job queue tells the apps above it, which it never imports.

``job_ended`` is sent inside the transaction that gives a job its final state, with
``job`` (its row as saved). A receiver that acts on the end registers its work with
``transaction.on_commit``; receivers run in the order they connected, after the
scheduling pass the end asked for.

``run_requeued`` is sent inside the transaction that puts a job that had started back in
its queue, with ``job`` (its row before the run's times are cleared), ``started_at``,
``stop_requested_at`` and ``preempted`` (its stop was a preemption).
"""

from __future__ import annotations

from django.dispatch import Signal

job_ended = Signal()
run_requeued = Signal()

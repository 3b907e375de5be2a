"""What cluster/ tells the layers above it, which it never imports.

Both are sent inside the transaction of the report or check that found them:
- ``node_reported_jobs``: a node's heartbeat listed the jobs it runs and starts
  (``node_id``, ``running_ids``, ``starting_ids``, ``now``); sent only where the portal
  schedules (not in Slurm mode, where Slurm says what runs).
- ``node_jobs_lost``: a node stayed silent past its grace (``node_id``, ``reason``); each
  receiver returns how many jobs it declared lost.
"""

from __future__ import annotations

from django.dispatch import Signal

node_reported_jobs = Signal()
node_jobs_lost = Signal()

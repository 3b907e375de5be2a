"""Beat entries of telemetry, merged into CELERY_BEAT_SCHEDULE in settings."""

from __future__ import annotations

from datetime import timedelta

TELEMETRY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    # Every minute: the newest complete minute, and the current hour so far.
    "telemetry-rollup": {"task": "control.telemetry_rollup", "schedule": timedelta(minutes=1)},
    # Bounded batches each time; a large backlog shrinks over several runs.
    "telemetry-prune": {"task": "control.telemetry_prune", "schedule": timedelta(minutes=10)},
}

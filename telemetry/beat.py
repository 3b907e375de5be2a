"""Beat entries of telemetry, collected into CELERY_BEAT_SCHEDULE by the settings."""

from __future__ import annotations

from datetime import timedelta

BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    # Every minute: the newest complete minute, and the current hour so far.
    "telemetry-rollup": {"task": "control.telemetry_rollup", "schedule": timedelta(minutes=1)},
    # Bounded batches each time; a large backlog shrinks over several runs.
    "telemetry-prune": {"task": "control.telemetry_prune", "schedule": timedelta(minutes=10)},
}

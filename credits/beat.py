"""Celery beat entries of charging jobs, collected into CELERY_BEAT_SCHEDULE by the settings."""

from __future__ import annotations

from datetime import timedelta

BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    # Matches CreditPolicy.charge_interval_minutes' default; each run charges up to the last window.
    "credits-charge-running-jobs": {
        "task": "control.credits_charge_running_jobs",
        "schedule": timedelta(minutes=5),
    },
    # A settle lost after a job's end (a worker killed after the commit) is made up here.
    "credits-settle-ended-jobs": {
        "task": "control.credits_settle_ended_jobs",
        "schedule": timedelta(minutes=1),
    },
}

"""Celery beat entries of the ledger, collected into CELERY_BEAT_SCHEDULE by the settings."""

from __future__ import annotations

from celery.schedules import crontab

BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    # Hourly rather than once at midnight on the 1st, so a beat that was down still grants;
    # the grant is idempotent per member and month.
    "credits-monthly-grant": {
        "task": "control.credits_monthly_grant",
        "schedule": crontab(minute=3),
    },
    "credits-check-ledger": {
        "task": "control.credits_check_ledger",
        "schedule": crontab(minute=17, hour=4),
    },
}

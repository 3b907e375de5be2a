"""Celery beat entries of credits and approvals, merged into CELERY_BEAT_SCHEDULE in settings."""

from __future__ import annotations

from datetime import timedelta

from celery.schedules import crontab

CREDITS_BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    # Matches CreditPolicy.charge_interval_minutes' default; each run charges up to the last window.
    "credits-charge-running-jobs": {
        "task": "control.credits_charge_running_jobs",
        "schedule": timedelta(minutes=5),
    },
    # Hourly rather than once at midnight on the 1st, so a beat that was down still grants;
    # the grant is idempotent per member and month.
    "credits-monthly-grant": {
        "task": "control.credits_monthly_grant",
        "schedule": crontab(minute=3),
    },
    # A settle lost after a job's end (a worker killed after the commit) is made up here.
    "credits-settle-ended-jobs": {
        "task": "control.credits_settle_ended_jobs",
        "schedule": timedelta(minutes=1),
    },
    "approvals-expire": {"task": "control.approvals_expire", "schedule": timedelta(minutes=1)},
    "credits-check-ledger": {
        "task": "control.credits_check_ledger",
        "schedule": crontab(minute=17, hour=4),
    },
}

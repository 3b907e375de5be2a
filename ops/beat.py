"""Celery beat entries of backups, merged into CELERY_BEAT_SCHEDULE in settings when enabled."""

from __future__ import annotations

from celery.schedules import crontab


def backup_beat_schedule(*, hour: int) -> dict[str, dict[str, object]]:
    return {
        "backup-nightly": {
            "task": "control.backup_nightly",
            "schedule": crontab(minute=7, hour=hour),
        },
        # Hourly, so an overdue backup is noticed within the hour; it notifies once a day.
        "backup-check-freshness": {
            "task": "control.backup_check_freshness",
            "schedule": crontab(minute=41),
        },
    }

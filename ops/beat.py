"""Celery beat entries of backups, collected into CELERY_BEAT_SCHEDULE by the settings when enabled."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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


def beat_schedule(settings: Mapping[str, Any]) -> dict[str, dict[str, object]]:
    # Nightly backups; off in the demo (DEBUG), on in production.
    if not settings["LABPORTAL_BACKUP_ENABLED"]:
        return {}
    return backup_beat_schedule(hour=settings["LABPORTAL_BACKUP_HOUR"])

"""Beat entries for the alert rules; merged into CELERY_BEAT_SCHEDULE by the settings."""

from __future__ import annotations

from datetime import timedelta

ALERTS_BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    "alerts-evaluate": {"task": "control.alerts_evaluate", "schedule": timedelta(seconds=30)},
}

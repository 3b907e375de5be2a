"""Beat entries for the alert rules; collected into CELERY_BEAT_SCHEDULE by the settings."""

from __future__ import annotations

from datetime import timedelta

BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    "alerts-evaluate": {"task": "control.alerts_evaluate", "schedule": timedelta(seconds=30)},
}

"""Celery beat entries of approvals, collected into CELERY_BEAT_SCHEDULE by the settings."""

from __future__ import annotations

from datetime import timedelta

BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    "approvals-expire": {"task": "control.approvals_expire", "schedule": timedelta(minutes=1)},
}

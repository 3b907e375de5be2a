"""Beat entries of the reports, collected into CELERY_BEAT_SCHEDULE by the settings."""

from __future__ import annotations

from celery.schedules import crontab

BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    # Hourly, so a page rarely meets a stale forecast, and a new week (always a new data
    # version) gets its fit within the hour. A no-op when the data did not change.
    "reports-forecast-refresh": {
        "task": "control.reports_forecast_refresh",
        "schedule": crontab(minute=3),
    },
}

"""Celery tasks of the reports: long work the control worker does off the web request."""

from __future__ import annotations

from celery import shared_task


@shared_task(
    name="control.report_task_run", soft_time_limit=540, time_limit=600, ignore_result=True
)
def report_task_run(task_id: int) -> None:
    """Run a queued replay or PDF; claimed atomically, so a second delivery does nothing."""
    from reports.services import report_task_run as run

    run(task_id=task_id)


@shared_task(
    name="control.reports_forecast_refresh", soft_time_limit=240, time_limit=300, ignore_result=True
)
def forecast_refresh() -> None:
    """Fit the demand forecast if the data changed since the last fit; a no-op otherwise."""
    from reports.services import forecast_refresh as refresh

    refresh()

"""Celery beat's entry into the alert rules."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from alerts.services import alerts_evaluate


@shared_task(name="control.alerts_evaluate", time_limit=120, soft_time_limit=100)
def alerts_evaluate_task() -> dict[str, Any]:
    """Celery beat, every 30 s: run the rules; safe to run twice."""
    report = alerts_evaluate()
    return {
        "fired": report.fired,
        "resolved": report.resolved,
        "actions": report.actions,
        "open": report.open,
    }

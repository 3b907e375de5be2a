"""Celery tasks of approvals: thin, safe to run twice (names unchanged)."""

from __future__ import annotations

from celery import shared_task

from approvals import services as approvals


@shared_task(
    name="control.approvals_expire", time_limit=120, soft_time_limit=100, ignore_result=True
)
def approvals_expire_task() -> dict[str, int]:
    return {
        "grants": approvals.grants_expire(),
        "emergencies": approvals.emergencies_expire(),
    }

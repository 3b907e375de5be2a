"""Celery tasks of charging jobs: thin, take ids, safe to run twice (names unchanged)."""

from __future__ import annotations

from celery import shared_task

from credits import services


@shared_task(
    name="control.credits_charge_running_jobs",
    time_limit=240,
    soft_time_limit=200,
    ignore_result=True,
)
def credits_charge_running_jobs_task() -> int:
    return services.credits_charge_running_jobs()


@shared_task(
    name="control.credits_settle_job", time_limit=120, soft_time_limit=100, ignore_result=True
)
def credits_settle_job_task(job_id: int) -> None:
    services.credits_settle_job(job_id=job_id)


@shared_task(
    name="control.credits_settle_ended_jobs",
    time_limit=300,
    soft_time_limit=240,
    ignore_result=True,
)
def credits_settle_ended_jobs_task() -> int:
    # Beat, every minute: a settle lost after a job's end (see jobqueue's _after_final).
    return services.credits_settle_ended_jobs()


@shared_task(
    name="control.credits_refund_job", time_limit=120, soft_time_limit=100, ignore_result=True
)
def credits_refund_job_task(job_id: int, reason: str) -> None:
    services.credits_refund_job(job_id=job_id, reason=reason)

"""Celery tasks of the jobs part: thin, take ids, safe to run twice."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from jobqueue import executors, scheduling, services
from jobqueue.signals import scheduling_pass_done


@shared_task(
    name="control.scheduling_pass", time_limit=120, soft_time_limit=100, ignore_result=True
)
def scheduling_pass_task() -> dict[str, Any]:
    if not executors.portal_schedules():  # Slurm mode: Slurm schedules, slurm.sync reconciles
        return {"skipped": "executor schedules itself"}
    result = scheduling.scheduling_pass()
    scheduling_pass_done.send(sender=scheduling_pass_task, duration_s=result.duration_ms / 1000)
    return {
        "started": result.started,
        "preempted": result.preempted,
        "ms": round(result.duration_ms, 1),
    }


@shared_task(name="control.jobs_enforce_time_limits", time_limit=120, ignore_result=True)
def jobs_enforce_time_limits_task() -> dict[str, int]:
    if not executors.portal_schedules():  # Slurm enforces --time itself
        return {}
    # A job whose stop was already asked is not stopped twice by the limits, but the
    # escalation makes sure it is not skipped for ever.
    return {**services.jobs_enforce_time_limits(), **services.jobs_escalate_stops()}

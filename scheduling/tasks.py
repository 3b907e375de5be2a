"""Celery tasks of LabPortal's own executor: thin, take ids, safe to run twice."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from cluster.tasks import report_accept
from jobqueue import executor, services
from scheduling import agent_events, passes
from scheduling.passes import passes_inline
from telemetry.metrics import SCHEDULING_PASS, SCHEDULING_PASS_BUCKETS, histogram_observe


@shared_task(
    name="control.scheduling_pass", time_limit=120, soft_time_limit=100, ignore_result=True
)
def scheduling_pass_task() -> dict[str, Any]:
    if not executor.portal_schedules():  # Slurm mode: Slurm schedules, slurm.sync reconciles
        return {"skipped": "executor schedules itself"}
    result = passes.scheduling_pass()
    histogram_observe(
        name=SCHEDULING_PASS, value=result.duration_ms / 1000, bounds=SCHEDULING_PASS_BUCKETS
    )
    return {
        "started": result.started,
        "preempted": result.preempted,
        "ms": round(result.duration_ms, 1),
    }


@shared_task(
    name="control.jobs_enforce_time_limits", time_limit=120, soft_time_limit=100, ignore_result=True
)
def jobs_enforce_time_limits_task() -> dict[str, int]:
    if not executor.portal_schedules():  # Slurm enforces --time itself
        return {}
    # A job whose stop was already asked is not stopped twice by the limits, but the
    # escalation makes sure it is not skipped for ever.
    return {**services.jobs_enforce_time_limits(), **agent_events.jobs_escalate_stops()}


@shared_task(
    name="control.job_event",
    bind=True,
    max_retries=None,  # retried until LABPORTAL_REPORT_RETRY_S (see report_accept)
    time_limit=60,
    soft_time_limit=50,
)
def job_event(self: Any, node_name: str, token: str, event: dict[str, Any]) -> str:
    # A job's end asks for a pass: it runs here, once the end is committed, so the freed
    # GPUs get their next jobs without a further trip through the broker.
    with passes_inline():
        return report_accept(
            self,
            "job_event",
            node_name,
            token,
            lambda name: agent_events.job_event_accept(node_name=name, event=event),
            [event],
        )


@shared_task(
    name="control.job_logs_report",
    bind=True,
    max_retries=None,  # retried until LABPORTAL_REPORT_RETRY_S (see report_accept)
    time_limit=60,
    soft_time_limit=50,
)
def job_logs_report(self: Any, node_name: str, token: str, job_id: int, text: str) -> str:
    return report_accept(
        self,
        "job_logs_report",
        node_name,
        token,
        lambda name: agent_events.job_logs_accept(node_name=name, job_id=job_id, text=text),
        [job_id, text],
    )

"""LabPortal's engine places jobs; the control worker dispatches them to node agents."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accounts.models import User
    from jobqueue.executor import OutsideJob, OutsideLiveJob
    from jobqueue.models import Job


class AgentsExecutor:
    name = "agents"
    portal_schedules = True
    runs_in_containers = True

    def job_queued(self, job: Job) -> None:
        self.wake()

    def jobs_queued(self, jobs: list[Job]) -> None:
        self.wake()  # one pass request for the whole array

    def booking_refusal(self, *, user: User, gpu_ids: list[int], maintenance: bool) -> str | None:
        return None  # the portal's engine keeps booked GPUs for their booking, one by one

    def jobs_outside_portal(self, *, start: datetime, end: datetime) -> list[OutsideJob]:
        return []  # every job on the agents' nodes is a portal job

    def live_jobs_outside_portal(self) -> list[OutsideLiveJob]:
        return []

    def job_cancel(self, job: Job, *, actor: User) -> None:
        from jobqueue.services import cancel_on_agents

        cancel_on_agents(job, actor=actor)

    def jobs_cancel(self, jobs: list[Job], *, actor: User) -> None:
        from jobqueue.services import cancel_many_on_agents

        cancel_many_on_agents(jobs, actor=actor)

    def job_stop(self, job: Job, *, grace_s: int, reason: str) -> None:
        from scheduling import dispatch

        if job.node is not None:
            dispatch.send_stop(node=job.node, job_id=job.pk, grace_s=grace_s, reason=reason)

    def wake(self) -> None:
        from scheduling.passes import scheduling_pass_request

        scheduling_pass_request()

    def sync(self) -> dict[str, Any]:
        from scheduling.passes import scheduling_pass

        result = scheduling_pass()
        return {"started": result.started, "preempted": result.preempted}

    def job_output(self, job: Job, *, refresh: bool) -> str:
        from scheduling import dispatch

        if refresh and job.node is not None and job.state in job.ACTIVE_STATES:
            dispatch.send_logs_request(node=job.node, job_id=job.pk)
        return job.log_tail

    def session_server(self, job: Job) -> str | None:
        return None  # through the node's gateway, with tickets (sessions.selectors)

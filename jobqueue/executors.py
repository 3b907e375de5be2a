"""Who runs the portal's jobs: LabPortal's own agents, or a Slurm cluster.

``current()`` gives the executor chosen by ``LABPORTAL_EXECUTOR``. The services call it
where the two differ (a job was queued, a job is cancelled, the periodic pass, a job's
output), so pages, the API and labctl never know which one runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from django.conf import settings

if TYPE_CHECKING:
    from accounts.models import User
    from jobqueue.models import Job


class Executor(Protocol):
    name: str
    # True where the portal's own engine places jobs (agents); False where the executor
    # schedules them itself (Slurm): then no scheduling pass and no agent dispatch run.
    portal_schedules: bool

    def job_queued(self, job: Job) -> None:
        """A validated job was saved (same transaction): send it on its way, or raise a JobRefused."""

    def job_cancel(self, job: Job, *, actor: User) -> None:
        """Cancel a job that has not ended (locked by the caller)."""

    def sync(self) -> dict[str, Any]:
        """The periodic pass: safe to run twice, returns what it did."""

    def job_output(self, job: Job, *, refresh: bool) -> str:
        """The latest output lines of the job."""


class AgentsExecutor:
    """LabPortal's engine places jobs; the control worker dispatches them to node agents."""

    name = "agents"
    portal_schedules = True

    def job_queued(self, job: Job) -> None:
        from jobqueue.services import request_scheduling_pass

        request_scheduling_pass()

    def job_cancel(self, job: Job, *, actor: User) -> None:
        from jobqueue.services import cancel_on_agents

        cancel_on_agents(job, actor=actor)

    def sync(self) -> dict[str, Any]:
        from jobqueue.scheduling import scheduling_pass

        result = scheduling_pass()
        return {"started": result.started, "preempted": result.preempted}

    def job_output(self, job: Job, *, refresh: bool) -> str:
        from jobqueue import dispatch

        if refresh and job.node is not None and job.state in job.ACTIVE_STATES:
            dispatch.send_logs_request(node=job.node, job_id=job.pk)
        return job.log_tail


def current() -> Executor:
    """The executor LABPORTAL_EXECUTOR names (agents by default)."""
    if settings.LABPORTAL_EXECUTOR == "slurm":
        from slurm.executor import SlurmExecutor

        return SlurmExecutor()
    return AgentsExecutor()


def portal_schedules() -> bool:
    return settings.LABPORTAL_EXECUTOR != "slurm"

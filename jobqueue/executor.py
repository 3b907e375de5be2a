"""Who runs the portal's jobs: the interface every executor implements, and ``current()``.

The job services call the executor where running a job differs (a job was queued, is
cancelled or must stop, something changed that may let jobs start, the periodic pass,
a job's output), so pages, the API and labctl never
know which one runs. The executors themselves live above the job queue and nothing
below imports them: ``scheduling.executor.AgentsExecutor`` (LabPortal's engine and node
agents) and ``slurm.executor.SlurmExecutor`` (an existing Slurm). ``current()`` loads
the class named in settings, ``LABPORTAL_EXECUTORS[LABPORTAL_EXECUTOR]`` or, for a
lab's own plug-in, the dotted path in ``LABPORTAL_EXECUTOR_CLASS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from core.executors import executor_class, portal_schedules

__all__ = ["Executor", "OutsideJob", "OutsideLiveJob", "current", "portal_schedules"]

if TYPE_CHECKING:
    from accounts.models import User
    from jobqueue.models import Job


@dataclass(frozen=True)
class OutsideJob:
    """A job the executor ran that the portal did not submit (plain ``sbatch`` on a Slurm
    cluster), as its accounting saw it: the usage report counts its GPU time too."""

    user_id: int | None
    queue_id: int | None  # the portal queue whose Slurm QOS or partition it ran under
    node: str  # its (first) node's name, "" where not known
    gpus: int
    submitted_at: datetime | None
    started_at: datetime
    ended_at: datetime | None  # None: still running
    final_state: str  # a Job.State value once ended, else ""
    project_id: int | None = None  # the portal project its --wckey named, if any


@dataclass(frozen=True)
class OutsideLiveJob:
    """A waiting or running job the portal did not submit, as the executor sees it now
    (the queue page lists them beside the portal's own)."""

    external_id: str  # the executor's own id (Slurm's job id)
    owner: str  # the member's user name, else the unix user
    where: str  # partition and QOS
    gpus: int
    running: bool
    reason: str  # why it waits, in the executor's words ("Priority", "Resources")
    started_at: datetime | None
    node: str


class Executor(Protocol):
    name: str
    # True where the portal's own engine places jobs (agents); False where the executor
    # schedules them itself (Slurm): then no scheduling pass and no agent dispatch run.
    portal_schedules: bool
    # True where each job runs in a container image (agents: Docker; Slurm with pyxis or
    # apptainer); False where it runs on the node as it is (Slurm without a container).
    runs_in_containers: bool

    def job_queued(self, job: Job) -> None:
        """A validated job was saved (same transaction): send it on its way, or raise a JobRefused."""

    def jobs_queued(self, jobs: list[Job]) -> None:
        """A job array's tasks were saved (same transaction): send them on their way
        together (Slurm: one ``sbatch --array``), or raise a JobRefused."""

    def job_cancel(self, job: Job, *, actor: User) -> None:
        """Cancel a job that has not ended (locked by the caller)."""

    def jobs_cancel(self, jobs: list[Job], *, actor: User) -> None:
        """Cancel several jobs that have not ended (locked by the caller), each as
        ``job_cancel`` would: a whole array at once. The jobs may hold only their id,
        state and owner; the executor loads what else it needs."""

    def job_stop(self, job: Job, *, grace_s: int, reason: str) -> None:
        """Ask a running job to stop: SIGTERM, then SIGKILL after ``grace_s`` seconds."""

    def wake(self) -> None:
        """Something changed that may let pending jobs start (a job ended, was released)."""

    def sync(self) -> dict[str, Any]:
        """The periodic pass: safe to run twice, returns what it did."""

    def job_output(self, job: Job, *, refresh: bool) -> str:
        """The latest output lines of the job."""

    def session_server(self, job: Job) -> str | None:
        """Where a running session's server listens when the portal reaches it directly
        (``http://host:port``), or None: through its node's gateway (agents), or not yet."""

    def booking_refusal(self, *, user: User, gpu_ids: list[int], maintenance: bool) -> str | None:
        """Why a booking of these GPUs could not be held for its owner, or None: the
        calendar refuses, with this reason, what the executor cannot fence."""

    def jobs_outside_portal(self, *, start: datetime, end: datetime) -> list[OutsideJob]:
        """Jobs that ran in [start, end) on the lab's GPUs without going through the portal."""

    def live_jobs_outside_portal(self) -> list[OutsideLiveJob]:
        """The jobs waiting or running now that the portal did not submit."""


def current() -> Executor:
    """The executor the settings name (LabPortal's agents by default)."""
    instance: Executor = executor_class()()
    return instance

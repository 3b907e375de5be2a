"""Slurm as the portal's executor: Slurm schedules and runs, the portal submits and reconciles."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from slurm import services
from slurm.accounting import plain_jobs_between
from slurm.reservations import booking_refusal

if TYPE_CHECKING:
    from accounts.models import User
    from jobqueue.executor import OutsideJob, OutsideLiveJob
    from jobqueue.models import Job


class SlurmExecutor:
    name = "slurm"
    portal_schedules = False

    @property
    def runs_in_containers(self) -> bool:
        from django.conf import settings

        return bool(settings.LABPORTAL_SLURM_CONTAINER != "none")

    def job_queued(self, job: Job) -> None:
        services.slurm_job_submit(job=job)

    def jobs_queued(self, jobs: list[Job]) -> None:
        services.slurm_array_submit(tasks=jobs)  # one sbatch --array

    def booking_refusal(self, *, user: User, gpu_ids: list[int], maintenance: bool) -> str | None:
        return booking_refusal(user=user, gpu_ids=gpu_ids, maintenance=maintenance)

    def jobs_outside_portal(self, *, start: datetime, end: datetime) -> list[OutsideJob]:
        return plain_jobs_between(start=start, end=end)

    def live_jobs_outside_portal(self) -> list[OutsideLiveJob]:
        return services.plain_jobs_live()

    def job_cancel(self, job: Job, *, actor: User) -> None:
        services.slurm_job_cancel(job=job, actor=actor)

    def jobs_cancel(self, jobs: list[Job], *, actor: User) -> None:
        from jobqueue.services import job_locked

        for job in jobs:  # scancel of each task: Slurm answers for each on its own
            services.slurm_job_cancel(job=job_locked(job.pk), actor=actor)

    def job_stop(self, job: Job, *, grace_s: int, reason: str) -> None:
        # Slurm signals the job itself (SIGTERM, then SIGKILL after its KillWait).
        services.slurm_job_stop(job=job)

    def wake(self) -> None:
        """Slurm schedules by itself: the portal runs no pass."""

    def sync(self) -> dict[str, Any]:
        result = services.slurm_jobs_sync()
        return {"seen": result.seen, "created": result.created, "changed": result.changed}

    def job_output(self, job: Job, *, refresh: bool) -> str:
        # Slurm writes the output file itself: read it while the job runs, or when asked.
        if refresh or not job.is_final or not job.log_tail:
            return services.slurm_job_output(job=job)
        return job.log_tail

    def session_server(self, job: Job) -> str | None:
        # The session's batch script prints where its server listens (sessions.launch).
        return services.slurm_session_server(job=job)

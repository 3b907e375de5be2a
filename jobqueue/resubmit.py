"""Running a job's spec again: "Submit again" (the same spec as a new job) and "Clone and
edit" (the submit form filled in from the job). Both go through the submit service."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from accounts.models import User
from jobqueue.models import Job
from jobqueue.submit import job_submit


def _open_project_name(job: Job) -> str:
    """The project the job was charged to, while it still takes jobs ("" otherwise)."""
    project = job.project
    return project.name if project is not None and project.active else ""


def job_spec(job: Job) -> dict[str, Any]:
    """The submit service's arguments that ask for this job again (a booking is not
    carried over: it was for one time slot)."""
    return {
        "queue": job.queue.name,
        "image": job.image.reference,
        "command": list(job.command),
        "gpus": job.gpus,
        "shared_slot": job.shared_slot,
        "env": dict(job.env or {}),
        "mounts": [m.name for m in job.mounts.all()],
        "time_limit_s": job.time_limit_s,
        "min_gpu_memory_mb": job.min_gpu_memory_mb,
        "gpu_model": job.gpu_model,
        "cpus": job.cpus,
        "memory_mb": job.memory_mb,
        "name": job.name,
        "preemptible": job.preemptible,
        "project": _open_project_name(job),
    }


def job_form_initial(job: Job) -> dict[str, Any]:
    """The submit form's fields as the member would have typed this job."""
    return {
        "name": job.name,
        "queue": job.queue.name,
        "image": job.image.reference,
        "command": job.command_display,
        "gpus": job.gpus,
        "shared_slot": job.shared_slot,
        "time_limit_hours": (Decimal(job.time_limit_s) / 3600).quantize(Decimal("0.01")),
        "gpu_model": job.gpu_model,
        "min_gpu_memory_gb": job.min_gpu_memory_mb // 1024 or None,
        "cpus": job.cpus,
        "memory_gb": max(1, job.memory_mb // 1024),
        "env": "\n".join(f"{k}={v}" for k, v in (job.env or {}).items()),
        "mounts": [m.name for m in job.mounts.all()],
        "preemptible": job.preemptible,
        "project": _open_project_name(job),
    }


def job_submit_again(*, job: Job, actor: User) -> Job:
    """Submit `job`'s spec as a new job of `actor`'s, checked against today's rules."""
    spec = job_spec(job)
    if spec["project"] and not job.project.is_open_to(actor):  # type: ignore[union-attr]
        spec["project"] = ""  # charged to the owner's project, not to one the actor is not in
    return job_submit(owner=actor, **spec)

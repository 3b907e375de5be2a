"""Factories for reservations and the running jobs the boundary tests need."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from jobqueue.models import Allocation, ContainerImage, Job, Queue


def running_job(
    *,
    owner: Any,
    gpus: list[Any],
    started_at: Any = None,
    time_limit_s: int = 3600,
    reservation: Any = None,
) -> Job:
    """A job running on `gpus` (with active Allocations), as the scheduler would leave it."""
    queue, _ = Queue.objects.get_or_create(name="normal", defaults={"tier": 1})
    image, _ = ContainerImage.objects.get_or_create(reference="busybox:latest")
    started_at = started_at or timezone.now()
    job = Job.objects.create(
        owner=owner,
        queue=queue,
        image=image,
        command=["sleep", "100"],
        gpus=len(gpus),
        time_limit_s=time_limit_s,
        reservation=reservation,
        state=Job.State.RUNNING,
        node=gpus[0].node,
        started_at=started_at,
    )
    for gpu in gpus:
        Allocation.objects.create(job=job, gpu=gpu, allocated_at=started_at)
    return job


def finished_job(*, owner: Any, gpus: list[Any], started_at: Any, hours: float) -> Job:
    job = running_job(owner=owner, gpus=gpus, started_at=started_at)
    ended = started_at + timedelta(hours=hours)
    Job.objects.filter(pk=job.pk).update(state=Job.State.COMPLETED, ended_at=ended)
    Allocation.objects.filter(job=job).update(active=False, released_at=ended)
    return job

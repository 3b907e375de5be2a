"""Reads that the pages and the API share."""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet

from jobqueue.models import Job


def queue_overview() -> dict[str, list[Job]]:
    """Pending jobs in queue order and running jobs with their GPUs."""
    waiting = list(
        Job.objects.filter(state__in=Job.WAITING_STATES)
        .select_related("owner", "queue")
        .order_by("queue_position", "submitted_at", "id")
    )
    waiting.sort(
        key=lambda j: (j.queue_position is None, j.queue_position or 0, j.submitted_at, j.pk)
    )
    running = list(
        Job.objects.filter(state__in=Job.ACTIVE_STATES)
        .select_related("owner", "queue", "node")
        .prefetch_related("allocations__gpu")
        .order_by("started_at", "id")
    )
    return {"waiting": waiting, "running": running}


def jobs_visible_to(user: Any) -> QuerySet[Job]:
    """Full job records a user may read: their own, or every job for staff."""
    jobs = Job.objects.select_related("owner", "queue", "image", "node")
    return jobs if user.is_staff else jobs.filter(owner=user)


def jobs_filtered(
    jobs: QuerySet[Job],
    *,
    state: str | None = None,
    queue: str | None = None,
    active: bool | None = None,
) -> QuerySet[Job]:
    if state:
        jobs = jobs.filter(state__in=state.split(","))
    if queue:
        jobs = jobs.filter(queue__name=queue)
    if active is True:
        jobs = jobs.filter(Q(state__in=Job.WAITING_STATES) | Q(state__in=Job.ACTIVE_STATES))
    return jobs

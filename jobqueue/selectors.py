"""Reads that the pages and the API share."""

from __future__ import annotations

from typing import Any

from django.db.models import F, Prefetch, Q, QuerySet

from jobqueue.models import Allocation, Job


def queue_overview(*, waiting_offset: int = 0, waiting_limit: int | None = None) -> dict[str, Any]:
    """Waiting jobs in queue order (a slice of them, and how many wait) and running jobs with their GPUs."""
    waiting_jobs = (
        Job.objects.filter(state__in=Job.WAITING_STATES)
        .select_related("owner", "queue")
        .order_by(F("queue_position").asc(nulls_last=True), "submitted_at", "id")
    )
    total = waiting_jobs.count()
    end = None if waiting_limit is None else waiting_offset + waiting_limit
    running = list(
        Job.objects.filter(state__in=Job.ACTIVE_STATES)
        .select_related("owner", "queue", "node")
        .prefetch_related(
            Prefetch(
                "allocations",
                queryset=Allocation.objects.filter(active=True).select_related("gpu__node"),
            )
        )
        .order_by("started_at", "id")
    )
    return {
        "waiting": list(waiting_jobs[waiting_offset:end]),
        "waiting_total": total,
        "waiting_offset": waiting_offset,
        "running": running,
    }


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

"""Reads that the pages and the API share."""

from __future__ import annotations

from typing import Any

from django.db.models import F, Prefetch, Q, QuerySet, prefetch_related_objects

from jobqueue.models import Allocation, Job

# What the queue page shows of each job (templates/jobqueue/_queue_tables.html): a busy
# page loads a hundred waiting and every running job, and their owners', queues' and GPUs'
# rows with them, so it reads only these columns (the API's overview reads whole rows).
PAGE_WAITING_FIELDS = (
    "id",
    "owner_id",
    "owner__username",
    "queue_id",
    "queue__name",
    "gpus",
    "shared_slot",
    "state",
    "queue_position",
    "estimated_start",
    "pending_reason",
    "hold_reason",
    "submitted_at",
    "reservation_id",
    "reservation__start",
)
PAGE_RUNNING_FIELDS = (
    "id",
    "owner_id",
    "owner__username",
    "queue_id",
    "queue__name",
    "node_id",
    "node__name",
    "state",
    "started_at",
    "time_limit_s",
)
PAGE_ALLOCATION_FIELDS = (
    "id",
    "job_id",
    "gpu_id",
    "gpu__index",
    "gpu__kind",
    "gpu__uuid",
    "gpu__node_id",
    "gpu__node__name",
)


def queue_overview(
    *, waiting_offset: int = 0, waiting_limit: int | None = None, for_page: bool = False
) -> dict[str, Any]:
    """Waiting jobs in queue order (a slice of them, and how many wait) and running jobs with
    their GPUs; ``for_page``: only what the queue page shows of them."""
    waiting_jobs = (
        Job.objects.filter(state__in=Job.WAITING_STATES)
        .select_related("owner", "queue", "reservation")
        .order_by(F("queue_position").asc(nulls_last=True), "submitted_at", "id")
    )
    total = waiting_jobs.count()
    end = None if waiting_limit is None else waiting_offset + waiting_limit
    allocations = Allocation.objects.filter(active=True).select_related("gpu__node")
    running_jobs = (
        Job.objects.filter(state__in=Job.ACTIVE_STATES)
        .select_related("owner", "queue", "node")
        .order_by("started_at", "id")
    )
    if for_page:
        waiting_jobs = waiting_jobs.only(*PAGE_WAITING_FIELDS)
        running_jobs = running_jobs.only(*PAGE_RUNNING_FIELDS)
        allocations = allocations.only(*PAGE_ALLOCATION_FIELDS)
    running = list(running_jobs.prefetch_related(Prefetch("allocations", queryset=allocations)))
    waiting = list(waiting_jobs[waiting_offset:end])
    # "Waiting for job 12.": the jobs it waits for, read once for the page (none: no query).
    prefetch_related_objects(
        [job for job in waiting if job.pending_reason == "dependency"],
        Prefetch("depends_on", queryset=Job.objects.only("id", "state", "exit_code")),
    )
    return {
        "waiting": waiting,
        "waiting_total": total,
        "waiting_offset": waiting_offset,
        "running": running,
    }


def jobs_visible_to(user: Any) -> QuerySet[Job]:
    """Full job records a user may read: their own, or every job for staff."""
    jobs = Job.objects.select_related("owner", "queue", "image", "node", "reservation")
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

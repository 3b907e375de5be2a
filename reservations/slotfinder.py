"""Finding the earliest free slot: N whole GPUs on one node for a given length."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db.models import QuerySet
from django.utils import formats, timezone
from django.utils.translation import gettext as _

from reservations.timegrid import ceil_to_grid

if TYPE_CHECKING:
    from cluster.models import Gpu


@dataclass(frozen=True)
class FreeSlot:
    node_id: int
    node_name: str
    gpu_ids: tuple[int, ...]
    gpu_labels: tuple[str, ...]
    start: datetime
    end: datetime

    def describe(self) -> str:
        return _("The nearest free slot: %(start)s – %(end)s on %(gpus)s.") % {
            "start": formats.date_format(timezone.localtime(self.start), "SHORT_DATETIME_FORMAT"),
            "end": formats.date_format(timezone.localtime(self.end), "SHORT_DATETIME_FORMAT"),
            "gpus": ", ".join(self.gpu_labels),
        }

    def as_dict(self) -> dict[str, object]:
        return {
            "node": self.node_name,
            "gpus": list(self.gpu_ids),
            "gpu_labels": list(self.gpu_labels),
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
        }


def bookable_gpus() -> QuerySet[Gpu]:
    """Whole, available GPUs on nodes that are up: the only ones a booking may hold."""
    from cluster.models import Gpu, Node

    return Gpu.objects.filter(
        kind=Gpu.Kind.WHOLE, state=Gpu.State.AVAILABLE, node__state=Node.State.UP
    ).select_related("node")


def busy_intervals(
    *,
    gpu_ids: Iterable[int],
    since: datetime,
    until: datetime,
    now: datetime,
    exclude_reservation_id: int | None = None,
    include_running_jobs: bool = True,
) -> dict[int, list[tuple[datetime, datetime]]]:
    """Per GPU, the [start, end) intervals taken by live bookings (and, if asked, running jobs)."""
    from jobqueue.models import Allocation, Job
    from reservations.models import ReservationSlot

    gpu_ids = list(gpu_ids)
    busy: dict[int, list[tuple[datetime, datetime]]] = defaultdict(list)
    slots = ReservationSlot.objects.filter(
        gpu_id__in=gpu_ids, live=True, start__lt=until, end__gt=since
    )
    if exclude_reservation_id is not None:
        slots = slots.exclude(reservation_id=exclude_reservation_id)
    for gpu_id, start, end in slots.values_list("gpu_id", "start", "end"):
        busy[gpu_id].append((start, end))
    if include_running_jobs:
        allocations = Allocation.objects.filter(
            gpu_id__in=gpu_ids, active=True, job__state__in=Job.ACTIVE_STATES
        ).select_related("job")
        for allocation in allocations:
            began = allocation.job.started_at or allocation.allocated_at
            expected_end = began + timedelta(seconds=allocation.job.time_limit_s)
            if expected_end > since:
                busy[allocation.gpu_id].append((min(now, began), expected_end))
    return busy


def free_slot_earliest(
    *,
    gpu_count: int,
    length: timedelta,
    after: datetime,
    granularity: timedelta,
    horizon_end: datetime,
    now: datetime | None = None,
    node_id: int | None = None,
    gpu_ids: list[int] | None = None,
    exclude_reservation_id: int | None = None,
    include_running_jobs: bool = True,
) -> FreeSlot | None:
    """The earliest on-grid start at or after `after` where `gpu_count` GPUs of one node are free.

    With `gpu_ids`, exactly those GPUs must be free. None if nothing fits before `horizon_end`.
    """
    now = now or timezone.now()
    gpus = bookable_gpus().order_by("node__name", "index")
    if node_id is not None:
        gpus = gpus.filter(node_id=node_id)
    if gpu_ids is not None:
        gpus = gpus.filter(pk__in=gpu_ids)
    gpu_list = list(gpus)
    if gpu_ids is not None and len(gpu_list) != len(set(gpu_ids)):
        return None
    by_node: dict[int, list[Gpu]] = defaultdict(list)
    for gpu in gpu_list:
        by_node[gpu.node_id].append(gpu)
    busy = busy_intervals(
        gpu_ids=[g.pk for g in gpu_list],
        since=after,
        until=horizon_end,
        now=now,
        exclude_reservation_id=exclude_reservation_id,
        include_running_jobs=include_running_jobs,
    )
    first = ceil_to_grid(after, granularity)
    candidates = {first}
    for intervals in busy.values():
        for _start, end in intervals:
            if end > first:
                candidates.add(ceil_to_grid(end, granularity))
    # Named GPUs must all be free together, wherever they are; otherwise any N of one node.
    groups = [gpu_list] if gpu_ids is not None else list(by_node.values())
    for start in sorted(candidates):
        end = start + length
        if end > horizon_end:
            break
        for group in groups:
            free = [
                g for g in group if all(not (s < end and e > start) for s, e in busy.get(g.pk, []))
            ]
            needed = len(group) if gpu_ids is not None else gpu_count
            if group and len(free) >= needed:
                chosen = free[:needed]
                return FreeSlot(
                    node_id=chosen[0].node_id,
                    node_name=chosen[0].node.name,
                    gpu_ids=tuple(g.pk for g in chosen),
                    gpu_labels=tuple(g.label for g in chosen),
                    start=start,
                    end=end,
                )
    return None

"""Reads of the reservations that the scheduler, the pages and the API share."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db.models import Prefetch, Q, QuerySet
from django.utils import timezone

from reservations.models import Reservation
from reservations.slotfinder import FreeSlot, free_slot_earliest

if TYPE_CHECKING:
    from cluster.models import Gpu


def reservation_rows_for_scheduler(
    *, now: datetime, horizon: timedelta
) -> list[tuple[int, str, tuple[str, ...], datetime, datetime]]:
    """Live bookings overlapping [now, now + horizon] as plain rows (id, user name, GPU uuids
    in node and index order, start, end), by start: no model instances, and the GPUs'
    query only when there is a booking (a pass runs after every job's end)."""
    live = Reservation.objects.live().filter(start__lt=now + horizon, end__gt=now)
    rows = list(live.order_by("start", "pk").values_list("pk", "user__username", "start", "end"))
    if not rows:
        return []
    gpus: dict[int, list[str]] = defaultdict(list)
    for reservation_id, uuid in (
        Reservation.gpus.through.objects.filter(reservation_id__in=[row[0] for row in rows])
        .order_by("gpu__node__name", "gpu__index")
        .values_list("reservation_id", "gpu__uuid")
    ):
        gpus[reservation_id].append(uuid)
    return [
        (pk, username, tuple(gpus.get(pk, ())), start, end) for pk, username, start, end in rows
    ]


def reservations_of_user(*, user: Any) -> dict[str, list[Reservation]]:
    """The member's bookings for 'My reservations': upcoming and running first, then past."""
    mine = (
        Reservation.objects.filter(user=user)
        .select_related("slurm_reservation")
        .prefetch_related(Prefetch("gpus", queryset=_gpus_with_nodes()))
        .order_by("start")
    )
    live = [r for r in mine if r.is_live]
    past = sorted((r for r in mine if not r.is_live), key=lambda r: r.start, reverse=True)[:50]
    return {"live": live, "past": past}


def _gpus_with_nodes() -> QuerySet[Gpu]:
    from cluster.models import Gpu

    return Gpu.objects.select_related("node").order_by("node__name", "index")


# --- The calendar ------------------------------------------------------------------------


@dataclass
class Bar:
    """Something drawn on a GPU's row: a booking or a running job's expected end."""

    kind: str  # "mine", "other", "maintenance", "job"
    left_pct: float
    width_pct: float
    title: str
    reservation: BarBooking | None = None
    job_id: int | None = None


@dataclass(frozen=True)
class BarBooking:
    """What a booking's bar shows (read as values: no Reservation or User instances)."""

    pk: int
    start: datetime
    end: datetime
    note: str
    is_maintenance: bool
    user_id: int
    who: str  # its member's display name (full name, else user name)


@dataclass
class GpuRow:
    gpu: Any
    bookable: bool
    bars: list[Bar] = field(default_factory=list)


@dataclass
class NodeGroup:
    node: Any
    rows: list[GpuRow]


@dataclass
class Column:
    start: datetime
    end: datetime
    busy: float  # the usual busy fraction of this hour of the week, 0..1
    busy_level: int  # 0..4, for the shading class
    starts_hour: bool
    starts_day: bool

    @property
    def busy_pct(self) -> int:
        return round(self.busy * 100)


def hour_of_week(moment: datetime) -> int:
    local = timezone.localtime(moment)
    return local.weekday() * 24 + local.hour


BUSY_HOURS_REUSE = timedelta(minutes=10)
BUSY_HOURS_COMPUTE_S = 60  # a request that died while computing holds the others no longer
BUSY_HOURS_LATEST_S = 24 * 3600  # the last profile, shown while the next one is computed


def busy_fraction_by_hour_of_week(*, now: datetime, weeks: int = 4) -> dict[int, float]:
    """How busy each hour of the week usually is: allocated GPU-time / GPU capacity, over `weeks`.

    Hour 0 is Monday 00:00 local time. Computed from Allocations (running and past),
    and kept in the cache while no allocation is made or released, for at most
    BUSY_HOURS_REUSE: a profile over weeks moves slowly, and a busy lab has tens of
    thousands of allocations to sum.
    """
    from django.core.cache import cache
    from django.db.models import Count, Max

    from cluster.models import Gpu
    from jobqueue.models import Allocation

    capacity_gpus = Gpu.objects.filter(kind=Gpu.Kind.WHOLE).exclude(state=Gpu.State.MISSING).count()
    if not capacity_gpus:
        return {h: 0.0 for h in range(168)}
    fingerprint = Allocation.objects.aggregate(
        newest=Max("pk"), active=Count("pk", filter=Q(active=True))
    )
    bucket = int(now.timestamp() // BUSY_HOURS_REUSE.total_seconds())
    key = (
        f"busy-hours:{weeks}:{bucket}:{capacity_gpus}:{fingerprint['newest']}:"
        f"{fingerprint['active']}:{timezone.get_current_timezone_name()}"
    )
    cached = cache.get(key)
    if cached is not None:
        return dict(cached)
    # Summing a busy lab's allocations takes about half a second. While one request
    # does it, the others show the last profile computed (it moves slowly) instead of
    # all summing at once; with none yet, each computes as before.
    latest_key = f"busy-hours:{weeks}:latest:{capacity_gpus}:{timezone.get_current_timezone_name()}"
    if not cache.add(f"{key}:computing", True, BUSY_HOURS_COMPUTE_S):
        latest = cache.get(latest_key)
        if latest is not None:
            return dict(latest)
    since = now - timedelta(weeks=weeks)
    intervals = (
        Allocation.objects.filter(allocated_at__lt=now)
        .filter(Q(released_at__isnull=True) | Q(released_at__gt=since))
        .values_list("allocated_at", "released_at", "active")
    )
    totals = _busy_seconds_by_hour_of_week(
        (
            (
                max(allocated_at, since).timestamp(),
                (now if active else min(released_at or now, now)).timestamp(),
            )
            for allocated_at, released_at, active in intervals
        ),
        since=since,
        now=now,
    )
    per_hour_capacity = capacity_gpus * weeks * 3600.0
    busy = {h: min(1.0, totals.get(h, 0.0) / per_hour_capacity) for h in range(168)}
    cache.set(key, busy, BUSY_HOURS_REUSE.total_seconds())
    cache.set(latest_key, busy, BUSY_HOURS_LATEST_S)
    return busy


def _busy_seconds_by_hour_of_week(
    intervals: Iterable[tuple[float, float]], *, since: datetime, now: datetime
) -> dict[int, float]:
    """Sweep the intervals' starts and ends once over the hours from `since` to `now`.

    The integral of "GPUs busy" over each local hour: O(n log n) for n allocations,
    instead of a loop over every hour of every allocation.
    """
    events: list[tuple[float, int]] = []
    for begin, end in intervals:
        if end > begin:
            events.append((begin, 1))
            events.append((end, -1))
    events.sort()
    totals: dict[int, float] = defaultdict(float)
    hour = timezone.localtime(since).replace(minute=0, second=0, microsecond=0)
    boundary = hour.timestamp()
    end_ts = now.timestamp()
    busy_gpus, last, i = 0, boundary, 0
    while boundary < end_ts:
        next_boundary = boundary + 3600.0
        seconds = 0.0
        while i < len(events) and events[i][0] < next_boundary:
            moment, delta = events[i]
            seconds += busy_gpus * (max(moment, boundary) - last)
            last = max(moment, boundary)
            busy_gpus += delta
            i += 1
        seconds += busy_gpus * (next_boundary - last)
        last = next_boundary
        totals[hour_of_week(datetime.fromtimestamp(boundary, tz=UTC))] += seconds
        boundary = next_boundary
    return totals


# A booking's fields that the calendar's bars read (calendar_cells.calendar_bars).
_BAR_FIELDS = (
    "id", "start", "end", "note", "is_maintenance", "user_id",
    "user__username", "user__first_name", "user__last_name",
)  # fmt: skip


# A GPU's and its node's fields that the calendar's rows read.
_ROW_FIELDS = (
    "id", "index", "model", "state", "kind", "uuid", "node_id",
    "node__id", "node__name", "node__state",
)  # fmt: skip


def calendar_view(
    *, user: Any, start: datetime, days: int, now: datetime, step: timedelta = timedelta(hours=1)
) -> dict[str, Any]:
    """GPUs as rows grouped by node, `step`-long columns, with bookings and running jobs' ends."""
    from cluster.models import Gpu, Node
    from jobqueue.models import Allocation, Job

    end = start + timedelta(days=days)
    span = (end - start).total_seconds()
    busy = busy_fraction_by_hour_of_week(now=now)
    columns = []
    moment = start
    while moment < end:
        local = timezone.localtime(moment)
        fraction = busy[hour_of_week(moment)]
        columns.append(
            Column(
                start=moment,
                end=moment + step,
                busy=fraction,
                busy_level=min(4, int(fraction * 5)),
                starts_hour=local.minute == 0,
                starts_day=local.hour == 0 and local.minute == 0,
            )
        )
        moment += step

    def position(a: datetime, b: datetime) -> tuple[float, float]:
        a, b = max(a, start), min(b, end)
        return (
            round((a - start).total_seconds() / span * 100, 3),
            round(max(0.0, (b - a).total_seconds()) / span * 100, 3),
        )

    gpus = list(
        Gpu.objects.filter(kind=Gpu.Kind.WHOLE)
        .select_related("node")
        # What the rows show (calendar_cells.calendar_rows): whole GPUs and nodes were a
        # tenth of the page.
        .only(*_ROW_FIELDS)
        .order_by("node__name", "index")
    )
    rows = {
        g.pk: GpuRow(
            gpu=g, bookable=g.state == Gpu.State.AVAILABLE and g.node.state == Node.State.UP
        )
        for g in gpus
    }
    # What the bars show, and only that: a busy week holds hundreds of bookings, and whole
    # users, bookings and GPUs for each were most of the page's time.
    bookings = [
        BarBooking(pk, begins, ends, note, maintenance, user_id, f"{first} {last}".strip() or name)
        for pk, begins, ends, note, maintenance, user_id, name, first, last in (
            Reservation.objects.live()
            .filter(start__lt=end, end__gt=start)
            .order_by("start", "pk")
            .values_list(*_BAR_FIELDS)
        )
    ]
    gpus_of: dict[int, list[int]] = defaultdict(list)
    booked = Reservation.gpus.through.objects.filter(reservation_id__in=[b.pk for b in bookings])
    for reservation_id, gpu_id in booked.values_list("reservation_id", "gpu_id"):
        gpus_of[reservation_id].append(gpu_id)
    for reservation in bookings:
        if reservation.is_maintenance:
            kind = "maintenance"
        elif reservation.user_id == user.pk:
            kind = "mine"
        else:
            kind = "other"
        left, width = position(reservation.start, reservation.end)
        # Like the queue, the calendar says whose a booking is: members plan around each other.
        who = reservation.who
        for gpu_id in gpus_of[reservation.pk]:
            if gpu_id in rows:
                rows[gpu_id].bars.append(
                    Bar(
                        kind=kind,
                        left_pct=left,
                        width_pct=width,
                        title=who,
                        reservation=reservation,
                    )
                )
    allocations = Allocation.objects.filter(
        active=True, job__state__in=Job.ACTIVE_STATES
    ).values_list("gpu_id", "job_id", "job__started_at", "allocated_at", "job__time_limit_s")
    for gpu_id, job_id, started_at, allocated_at, time_limit_s in allocations:
        began = started_at or allocated_at
        expected_end = began + timedelta(seconds=time_limit_s)
        if expected_end > start and began < end and gpu_id in rows:
            left, width = position(began, expected_end)
            rows[gpu_id].bars.append(
                Bar(kind="job", left_pct=left, width_pct=width, title=f"#{job_id}", job_id=job_id)
            )
    groups: list[NodeGroup] = []
    for gpu in gpus:
        if not groups or groups[-1].node.pk != gpu.node_id:
            groups.append(NodeGroup(node=gpu.node, rows=[]))
        groups[-1].rows.append(rows[gpu.pk])
    now_pct = position(now, now)[0] if start <= now < end else None
    return {"columns": columns, "groups": groups, "start": start, "end": end, "now_pct": now_pct}


def reservation_suggest(
    *,
    user: Any,
    gpu_count: int,
    length: timedelta,
    after: datetime | None = None,
    node_id: int | None = None,
    now: datetime | None = None,
) -> FreeSlot | None:
    """The earliest slot within the member's booking horizon with `gpu_count` GPUs of one node free.

    Running jobs count as busy until their time limit, so the slot is really free.
    """
    from reservations.models import BookingRule

    now = now or timezone.now()
    rules = BookingRule.for_user(user)
    horizon_days = max(rules.max_days_ahead, 1) if not user.is_staff else 60
    return free_slot_earliest(
        gpu_count=gpu_count,
        length=length,
        after=max(after or now, now),
        granularity=rules.granularity,
        horizon_end=now + timedelta(days=horizon_days),
        now=now,
        node_id=node_id,
    )

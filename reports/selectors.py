"""The usage report of a period: read from jobs, credits, reservations and telemetry.

Figures are GPU-hours of whole GPUs (a shared slot counts as its share of its GPU).
"Really used" is allocated GPU-hours weighted by each job's mean utilisation from
telemetry (`reports.utilisation`); jobs without telemetry count as allocated but
not in the used figure or the mean utilisation.
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db.models import Count, F, OuterRef, Q, Subquery, Sum
from django.utils import timezone

from accounts.models import LedgerEntry, User
from cluster.models import Gpu
from jobqueue.models import Allocation, Job
from reports.periods import Period
from reports.utilisation import job_mean_utilisation
from reservations.models import Reservation

FINAL_STATES: tuple[str, ...] = tuple(str(s) for s in Job.FINAL_STATES)
SPENDING_KINDS = (
    LedgerEntry.Kind.CHARGE,
    LedgerEntry.Kind.REFUND,
    LedgerEntry.Kind.RESERVATION,
    LedgerEntry.Kind.NO_SHOW,
)
DIMENSIONS = ("user", "category", "queue", "node", "model")
NO_CATEGORY = "—"


@dataclass
class UsageLine:
    """One row of a usage table: what one user (category, queue, node, model) got."""

    name: str
    gpu_hours: float = 0.0
    used_gpu_hours: float = 0.0
    # Allocated GPU-hours of jobs that have telemetry: the mean utilisation's denominator.
    measured_gpu_hours: float = 0.0
    jobs: Counter[str] = field(default_factory=Counter)
    credits: float = 0.0

    @property
    def mean_util_pct(self) -> float | None:
        if self.measured_gpu_hours <= 0:
            return None
        return 100.0 * self.used_gpu_hours / self.measured_gpu_hours

    @property
    def jobs_total(self) -> int:
        return sum(self.jobs.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gpu_hours": round(self.gpu_hours, 2),
            "used_gpu_hours": round(self.used_gpu_hours, 2),
            "mean_util_pct": None if self.mean_util_pct is None else round(self.mean_util_pct, 1),
            **{f"jobs_{state}": self.jobs.get(state, 0) for state in FINAL_STATES},
            "credits": round(self.credits, 2),
        }


@dataclass
class WaitLine:
    queue: str
    jobs: int
    mean_h: float
    p50_h: float
    p95_h: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "jobs_started": self.jobs,
            "wait_mean_h": round(self.mean_h, 2),
            "wait_p50_h": round(self.p50_h, 2),
            "wait_p95_h": round(self.p95_h, 2),
        }


@dataclass
class WeekLine:
    """Lab-wide figures of one week (clipped to the period and to now)."""

    week: dt.date
    capacity_gpu_hours: float = 0.0
    gpu_hours: float = 0.0
    used_gpu_hours: float = 0.0
    unmet_gpu_hours: float = 0.0

    @property
    def allocation_pct(self) -> float | None:
        return (
            None if self.capacity_gpu_hours <= 0 else 100 * self.gpu_hours / self.capacity_gpu_hours
        )

    @property
    def utilisation_pct(self) -> float | None:
        if self.capacity_gpu_hours <= 0:
            return None
        return 100 * self.used_gpu_hours / self.capacity_gpu_hours

    def as_dict(self) -> dict[str, Any]:
        def pct(value: float | None) -> float | None:
            return None if value is None else round(value, 1)

        return {
            "week": self.week.isoformat(),
            "capacity_gpu_hours": round(self.capacity_gpu_hours, 2),
            "gpu_hours": round(self.gpu_hours, 2),
            "allocation_pct": pct(self.allocation_pct),
            "used_gpu_hours": round(self.used_gpu_hours, 2),
            "utilisation_pct": pct(self.utilisation_pct),
            "unmet_gpu_hours": round(self.unmet_gpu_hours, 2),
        }


@dataclass
class BookingLine:
    user: str
    bookings: int = 0
    booked_h: float = 0.0
    released_h: float = 0.0
    no_show_h: float = 0.0

    @property
    def used_h(self) -> float:
        return self.booked_h - self.released_h - self.no_show_h

    def as_dict(self) -> dict[str, Any]:
        return {
            "user": self.user,
            "bookings": self.bookings,
            "booked_gpu_hours": round(self.booked_h, 2),
            "used_gpu_hours": round(self.used_h, 2),
            "released_gpu_hours": round(self.released_h, 2),
            "no_show_gpu_hours": round(self.no_show_h, 2),
        }


@dataclass
class UsageReport:
    period: Period
    capacity_gpus: int
    totals: UsageLine
    tables: dict[str, list[UsageLine]]
    waits: list[WaitLine]
    weeks: list[WeekLine]
    bookings: list[BookingLine]
    bookings_total: BookingLine
    scoped_to: str | None = None  # a member's username: only their own lines are in

    @property
    def unmet_gpu_hours(self) -> float:
        return sum(w.unmet_gpu_hours for w in self.weeks)


@dataclass(frozen=True)
class JobRow:
    id: int
    user: str
    category: str
    queue: str
    node: str
    model: str
    units: float  # whole-GPU equivalents held while running
    gpus: int
    shared_slot: bool
    state: str
    submitted: dt.datetime
    started: dt.datetime | None
    ended: dt.datetime | None


def _overlap_h(a0: dt.datetime, a1: dt.datetime, b0: dt.datetime, b1: dt.datetime) -> float:
    return max(0.0, (min(a1, b1) - max(a0, b0)).total_seconds() / 3600)


def percentile(values: list[float], pct: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    k = (len(ordered) - 1) * pct / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def week_start(day: dt.date) -> dt.date:
    return day - dt.timedelta(days=day.weekday())


class WeekGrid:
    """The weeks of [start, end), found by bisection (a report looks up weeks per job)."""

    def __init__(self, start: dt.datetime, end: dt.datetime) -> None:
        self.weeks = list(weeks_of(start, end))
        self.ends = [w1 for _m, _w0, w1 in self.weeks]

    def spanning(
        self, a: dt.datetime, b: dt.datetime
    ) -> Iterator[tuple[dt.date, dt.datetime, dt.datetime]]:
        """The weeks that meet [a, b)."""
        i = bisect.bisect_right(self.ends, a)
        while i < len(self.weeks) and self.weeks[i][1] < b:
            yield self.weeks[i]
            i += 1

    def monday_of(self, t: dt.datetime) -> dt.date | None:
        i = bisect.bisect_right(self.ends, t)
        return self.weeks[i][0] if i < len(self.weeks) else None


def weeks_of(
    start: dt.datetime, end: dt.datetime
) -> Iterator[tuple[dt.date, dt.datetime, dt.datetime]]:
    """(Monday, clipped start, clipped end) of each week that meets [start, end)."""
    monday = week_start(timezone.localtime(start).date())
    while True:
        w0 = timezone.make_aware(dt.datetime.combine(monday, dt.time.min))
        if w0 >= end:
            return
        w1 = w0 + dt.timedelta(days=7)
        yield monday, max(w0, start), min(w1, end)
        monday += dt.timedelta(days=7)


def _job_rows(period: Period) -> list[JobRow]:
    """Every job that waited, ran or ended in the period."""
    first_alloc = Allocation.objects.filter(job=OuterRef("pk")).order_by("id")
    rows = (
        Job.objects.filter(submitted_at__lt=period.end)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gte=period.start))
        .exclude(state=Job.State.HELD)
        .order_by()
        .annotate(
            alloc_model=Subquery(first_alloc.values("gpu__model")[:1]),
            alloc_parent_slots=Subquery(first_alloc.values("gpu__parent__shared_slots")[:1]),
        )
        .values_list(
            "id",
            "owner__username",
            "owner__category__name",
            "queue__name",
            "node__name",
            "alloc_model",
            "alloc_parent_slots",
            "gpus",
            "shared_slot",
            "state",
            "submitted_at",
            "started_at",
            "ended_at",
        )
    )
    jobs = []
    for (
        pk,
        user,
        category,
        queue,
        node,
        model,
        slots,
        gpus,
        shared,
        state,
        submitted,
        started,
        ended,
    ) in rows.iterator(chunk_size=5000):
        units = 1.0 / slots if shared and slots else float(gpus)
        jobs.append(
            JobRow(
                pk,
                user,
                category or NO_CATEGORY,
                queue,
                node or "—",
                model or "—",
                units,
                gpus,
                shared,
                state,
                submitted,
                started,
                ended,
            )
        )
    return jobs


def _keys(job: JobRow) -> dict[str, str]:
    return {
        "user": job.user,
        "category": job.category,
        "queue": job.queue,
        "node": job.node,
        "model": job.model,
    }


def _credits(period: Period) -> tuple[dict[str, dict[str, float]], float]:
    """Credits spent in the period per dimension and value, and in total (charges net of refunds)."""
    entries = LedgerEntry.objects.filter(
        created_at__gte=period.start, created_at__lt=period.end, kind__in=SPENDING_KINDS
    ).order_by()
    spent: dict[str, dict[str, float]] = {d: defaultdict(float) for d in DIMENSIONS}
    for key, field_name in (
        ("user", "account__user__username"),
        ("category", "account__user__category__name"),
    ):
        for row in entries.values(field_name).annotate(total=Sum("amount")):
            spent[key][row[field_name] or NO_CATEGORY] -= float(row["total"] or Decimal(0))
    job_entries = entries.filter(job__isnull=False)
    for key, field_name in (("queue", "job__queue__name"), ("node", "job__node__name")):
        for row in job_entries.values(field_name).annotate(total=Sum("amount")):
            spent[key][row[field_name] or "—"] -= float(row["total"] or Decimal(0))
    first_model = (
        Allocation.objects.filter(job=OuterRef("job_id")).order_by("id").values("gpu__model")[:1]
    )
    for row in (
        job_entries.annotate(model=Subquery(first_model))
        .values("model")
        .annotate(total=Sum("amount"))
    ):
        spent["model"][row["model"] or "—"] -= float(row["total"] or Decimal(0))
    total = entries.aggregate(total=Sum("amount"))["total"] or Decimal(0)
    return spent, 0.0 - float(total)  # 0.0 - x: never a negative zero


def unmet_demand(
    jobs: list[JobRow],
    capacity: int,
    start: dt.datetime,
    end: dt.datetime,
    weeks: dict[dt.date, WeekLine],
) -> None:
    """GPU-hours that waited while fewer GPUs were free in the whole lab than the job asked for.

    A sweep over the period: at each moment, busy = units of running jobs; every waiting
    job that asks for more whole GPUs than are free adds its GPUs to the week's figure.
    """
    events: list[tuple[dt.datetime, int, float, int]] = []  # (time, kind, busy delta, size)
    for job in jobs:
        if job.started is not None:
            run_end = job.ended or end
            if run_end > start and job.started < end:
                events.append((max(job.started, start), 0, job.units, 0))
                events.append((min(run_end, end), 0, -job.units, 0))
        if job.shared_slot:
            continue
        wait_end = job.started or job.ended or end
        if wait_end > start and job.submitted < end:
            events.append((max(job.submitted, start), 1, 0.0, job.gpus))
            events.append((min(wait_end, end), 2, 0.0, job.gpus))
    grid = WeekGrid(start, end)
    for w1 in grid.ends:
        events.append((w1, 3, 0.0, 0))
    events.sort(key=lambda e: e[0])
    busy = 0.0
    waiting: Counter[int] = Counter()
    t_prev = start
    for t, kind, delta, size in events:
        if t > t_prev and waiting:
            free = capacity - busy
            short = sum(s * n for s, n in waiting.items() if s > free + 1e-9)
            if short:
                monday = grid.monday_of(t_prev)
                week = weeks.get(monday) if monday is not None else None
                if week is not None:
                    week.unmet_gpu_hours += short * (t - t_prev).total_seconds() / 3600
        t_prev = max(t_prev, t)
        if kind == 0:
            busy += delta
        elif kind == 1:
            waiting[size] += 1
        elif kind == 2:
            waiting[size] -= 1
            if not waiting[size]:
                del waiting[size]


def _bookings(period: Period, end: dt.datetime) -> dict[str, BookingLine]:
    lines: dict[str, BookingLine] = {}
    reservations = (
        Reservation.objects.filter(start__lt=period.end, end__gt=period.start, is_maintenance=False)
        .exclude(state=Reservation.State.CANCELLED)
        .order_by()
        .annotate(gpu_count=Count("gpus"), booked=F("booked_end"))
        .values_list("user__username", "start", "end", "booked", "no_show", "gpu_count")
    )
    for user, r_start, r_end, booked_end, no_show, n in reservations:
        line = lines.setdefault(user, BookingLine(user))
        booked_until = max(booked_end or r_end, r_end)
        booked = n * _overlap_h(r_start, booked_until, period.start, period.end)
        line.bookings += 1
        line.booked_h += booked
        line.released_h += n * _overlap_h(r_end, booked_until, period.start, period.end)
        if no_show:
            line.no_show_h += n * _overlap_h(r_start, r_end, period.start, min(period.end, end))
    return lines


def _sorted_lines(lines: Iterable[UsageLine]) -> list[UsageLine]:
    return sorted(lines, key=lambda line: (-line.gpu_hours, line.name))


def usage_report(*, period: Period, viewer: User, now: dt.datetime | None = None) -> UsageReport:
    """The usage report of `period` as `viewer` may see it.

    Staff see every line; anyone else sees the lab totals, the lab-wide tables (queues,
    nodes, GPU models, waits, weeks) and only their own user and booking lines.
    """
    now = now or timezone.now()
    end = min(period.end, max(now, period.start))
    capacity = Gpu.objects.filter(kind=Gpu.Kind.WHOLE).count()
    jobs = _job_rows(period)
    util = job_mean_utilisation(start=period.start, end=end)
    spent, spent_total = _credits(period)

    totals = UsageLine("lab")
    tables: dict[str, dict[str, UsageLine]] = {d: {} for d in DIMENSIONS}
    grid = WeekGrid(period.start, end)
    weeks = {monday: WeekLine(monday) for monday, _w0, _w1 in grid.weeks}
    for monday, w0, w1 in grid.weeks:
        weeks[monday].capacity_gpu_hours = capacity * (w1 - w0).total_seconds() / 3600
    for job in jobs:
        lines = [totals] + [
            tables[d].setdefault(value, UsageLine(value)) for d, value in _keys(job).items()
        ]
        if (
            job.ended is not None
            and period.start <= job.ended < period.end
            and job.state in FINAL_STATES
        ):
            for line in lines:
                line.jobs[job.state] += 1
        if job.started is None:
            continue
        run_end = job.ended or end
        hours = job.units * _overlap_h(job.started, run_end, period.start, end)
        if hours <= 0:
            continue
        mean = util.get(job.id)
        for line in lines:
            line.gpu_hours += hours
            if mean is not None:
                line.used_gpu_hours += hours * mean
                line.measured_gpu_hours += hours
        for monday, w0, w1 in grid.spanning(max(job.started, period.start), min(run_end, end)):
            week_hours = job.units * _overlap_h(job.started, run_end, w0, w1)
            weeks[monday].gpu_hours += week_hours
            if mean is not None:
                weeks[monday].used_gpu_hours += week_hours * mean
    for dimension, values in spent.items():
        for value, amount in values.items():
            tables[dimension].setdefault(value, UsageLine(value)).credits += amount
    totals.credits = spent_total

    waits_by_queue: dict[str, list[float]] = defaultdict(list)
    for job in jobs:
        if job.started is not None and period.start <= job.started < period.end:
            waits_by_queue[job.queue].append((job.started - job.submitted).total_seconds() / 3600)
    waits = [
        WaitLine(q, len(w), sum(w) / len(w), percentile(w, 50), percentile(w, 95))
        for q, w in sorted(waits_by_queue.items())
    ]
    unmet_demand(jobs, capacity, period.start, end, weeks)

    bookings = _bookings(period, end)
    bookings_total = BookingLine("lab")
    for booking in bookings.values():
        bookings_total.bookings += booking.bookings
        bookings_total.booked_h += booking.booked_h
        bookings_total.released_h += booking.released_h
        bookings_total.no_show_h += booking.no_show_h

    scoped_to = None if viewer.is_staff else viewer.username
    result_tables = {d: _sorted_lines(lines.values()) for d, lines in tables.items()}
    booking_lines = sorted(bookings.values(), key=lambda b: (-b.booked_h, b.user))
    if scoped_to is not None:
        result_tables["user"] = [line for line in result_tables["user"] if line.name == scoped_to]
        del result_tables["category"]  # a small category would name its members
        booking_lines = [b for b in booking_lines if b.user == scoped_to]
    return UsageReport(
        period=period,
        capacity_gpus=capacity,
        totals=totals,
        tables=result_tables,
        waits=waits,
        weeks=[weeks[m] for m in sorted(weeks)],
        bookings=booking_lines,
        bookings_total=bookings_total,
        scoped_to=scoped_to,
    )

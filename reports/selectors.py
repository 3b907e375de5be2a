"""The usage report of a period: read from jobs, credits, reservations and telemetry.

Figures are GPU-hours of whole GPUs (a shared slot counts as its share of its GPU).
"Really used" GPU-hours come from telemetry (`reports.utilisation`: hourly rollups, then
minute rollups, then raw samples for what the rollups have not reached); GPU-hours
without telemetry count as allocated but not in the used figure or the mean utilisation.

Every sum is computed by the database (one GROUP BY over the five dimensions, one
conditional sum per week); only waits (percentiles) and unmet demand (a sweep over
time) read one lean row per job.
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

from django.db.models import (
    Case,
    Count,
    F,
    FloatField,
    Func,
    OuterRef,
    Q,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Cast, Coalesce, Greatest, Least, NullIf
from django.utils import timezone

from accounts.models import LedgerEntry, User
from cluster.models import Gpu
from jobqueue.models import Allocation, Job
from reports.periods import Period
from reports.utilisation import (
    TelemetryWindows,
    raw_mean_utilisation,
    rollup_usage,
    rollup_usage_by_week,
    telemetry_windows,
)
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


class EpochSeconds(Func):
    """Seconds since 1970 of a datetime expression, as a float, on PostgreSQL and SQLite."""

    output_field = FloatField()

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, template="EXTRACT(EPOCH FROM %(expressions)s)")

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(
            compiler, connection, template="((julianday(%(expressions)s) - 2440587.5) * 86400.0)"
        )


def _seconds(moment: dt.datetime) -> Value:
    return Value(moment.timestamp(), output_field=FloatField())


def _overlap_s(lo: dt.datetime, hi: dt.datetime, run_end: dt.datetime) -> Any:
    """Seconds of a job's run (start to end, or to `run_end` if still running) in [lo, hi)."""
    began = EpochSeconds("started_at")
    ended = Coalesce(EpochSeconds("ended_at"), _seconds(run_end))
    return Greatest(
        Value(0.0), Least(ended, _seconds(hi), _seconds(run_end)) - Greatest(began, _seconds(lo))
    )


def _runs_in(lo: dt.datetime, hi: dt.datetime) -> Q:
    """Jobs that ran at some time in [lo, hi)."""
    return Q(started_at__lt=hi) & (Q(ended_at__isnull=True) | Q(ended_at__gt=lo))


def _period_jobs(period: Period) -> Any:
    """Every job that waited, ran or ended in the period, with its GPU model (of its first
    allocated GPU) and its units (whole-GPU equivalents held while running)."""
    first_alloc = Allocation.objects.filter(job=OuterRef("pk")).order_by("id")
    slots = Subquery(first_alloc.values("gpu__parent__shared_slots")[:1])
    return (
        Job.objects.filter(submitted_at__lt=period.end)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gte=period.start))
        .exclude(state=Job.State.HELD)
        .order_by()
        .annotate(
            alloc_model=Subquery(first_alloc.values("gpu__model")[:1]),
            units=Case(
                When(
                    shared_slot=True,
                    then=Coalesce(
                        1.0 / Cast(NullIf(slots, 0), FloatField()), Cast("gpus", FloatField())
                    ),
                ),
                default=Cast("gpus", FloatField()),
                output_field=FloatField(),
            ),
        )
    )


DIMENSION_FIELDS = {
    "user": "owner__username",
    "category": "owner__category__name",
    "queue": "queue__name",
    "node": "node__name",
    "model": "alloc_model",
}
# The same dimensions as telemetry rollups reach them (the model of the GPU measured).
ROLLUP_DIMENSION_FIELDS = {
    "user": "job__owner__username",
    "category": "job__owner__category__name",
    "queue": "job__queue__name",
    "node": "job__node__name",
    "model": "gpu__model",
}


def _dimension_key(dimension: str, value: object) -> str:
    if dimension == "category":
        return str(value) if value else NO_CATEGORY
    return str(value) if value else "—"


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


def _usage_tables(
    period: Period, end: dt.datetime, windows: TelemetryWindows
) -> tuple[UsageLine, dict[str, dict[str, UsageLine]]]:
    """Allocated GPU-hours and jobs by final state per user, category, queue, node and GPU
    model, summed in SQL over one GROUP BY of all five; used GPU-hours from telemetry."""
    run_s = F("units") * _overlap_s(period.start, end, end)
    sums: dict[str, Any] = {
        "alloc_s": Sum(run_s, filter=_runs_in(period.start, end)),
        **{
            f"n_{state}": Count(
                "id",
                filter=Q(state=state, ended_at__gte=period.start, ended_at__lt=period.end),
            )
            for state in FINAL_STATES
        },
    }
    if windows.raw is not None:
        # The part the rollups have not reached: each job's mean of its raw samples.
        raw_start, raw_end = windows.raw
        raw_s = F("units") * _overlap_s(raw_start, raw_end, end)
        in_raw = _runs_in(raw_start, raw_end) & Q(raw_mean__isnull=False)
        sums["raw_used_s"] = Sum(raw_s * F("raw_mean"), filter=in_raw)
        sums["raw_measured_s"] = Sum(raw_s, filter=in_raw)
    jobs = _period_jobs(period)
    if windows.raw is not None:
        jobs = jobs.annotate(raw_mean=raw_mean_utilisation(windows.raw))
    rows = jobs.values(*DIMENSION_FIELDS.values()).annotate(**sums)

    totals = UsageLine("lab")
    tables: dict[str, dict[str, UsageLine]] = {d: {} for d in DIMENSIONS}
    for row in rows:
        lines = [totals] + [
            tables[d].setdefault(key, UsageLine(key))
            for d, path in DIMENSION_FIELDS.items()
            for key in [_dimension_key(d, row[path])]
        ]
        hours = (row["alloc_s"] or 0.0) / 3600
        used = (row.get("raw_used_s") or 0.0) / 3600
        measured = (row.get("raw_measured_s") or 0.0) / 3600
        for line in lines:
            line.gpu_hours += hours
            line.used_gpu_hours += used
            line.measured_gpu_hours += measured
            for state in FINAL_STATES:
                if row[f"n_{state}"]:
                    line.jobs[state] += row[f"n_{state}"]
    for (*keys,), (used, measured) in rollup_usage(windows, **ROLLUP_DIMENSION_FIELDS).items():
        lines = [totals] + [
            tables[d].setdefault(key, UsageLine(key))
            for d, value in zip(DIMENSIONS, keys, strict=True)
            for key in [_dimension_key(d, value)]
        ]
        for line in lines:
            line.used_gpu_hours += used
            line.measured_gpu_hours += measured
    return totals, tables


def _usage_weeks(
    period: Period, end: dt.datetime, capacity: int, windows: TelemetryWindows
) -> dict[dt.date, WeekLine]:
    """Capacity, allocated and used GPU-hours per week: allocated as one conditional sum per
    week over the jobs that ran in it, used from the rollups truncated to weeks."""
    grid = WeekGrid(period.start, end)
    weeks = {monday: WeekLine(monday) for monday, _w0, _w1 in grid.weeks}
    sums: dict[str, Any] = {}
    for i, (monday, w0, w1) in enumerate(grid.weeks):
        weeks[monday].capacity_gpu_hours = capacity * (w1 - w0).total_seconds() / 3600
        sums[f"w{i}"] = Sum(F("units") * _overlap_s(w0, w1, end), filter=_runs_in(w0, w1))
        if windows.raw is not None:
            r0, r1 = max(w0, windows.raw[0]), min(w1, windows.raw[1])
            if r0 < r1:
                sums[f"r{i}"] = Sum(
                    F("units") * _overlap_s(r0, r1, end) * F("raw_mean"),
                    filter=_runs_in(r0, r1) & Q(raw_mean__isnull=False),
                )
    if sums:
        jobs = _period_jobs(period).filter(started_at__isnull=False)
        if windows.raw is not None:
            jobs = jobs.annotate(raw_mean=raw_mean_utilisation(windows.raw))
        row = jobs.aggregate(**sums)
        for i, (monday, _w0, _w1) in enumerate(grid.weeks):
            weeks[monday].gpu_hours = (row[f"w{i}"] or 0.0) / 3600
            weeks[monday].used_gpu_hours = (row.get(f"r{i}") or 0.0) / 3600
    for monday, used in rollup_usage_by_week(windows).items():
        if monday in weeks:
            weeks[monday].used_gpu_hours += used
    return weeks


def _waits_and_demand(
    period: Period, end: dt.datetime, capacity: int, weeks: dict[dt.date, WeekLine]
) -> list[WaitLine]:
    """Waits per queue (percentiles need every wait) and unmet demand per week (a sweep over
    the period): both read one lean row per job."""
    rows = _period_jobs(period).values_list(
        "queue__name", "units", "gpus", "shared_slot", "submitted_at", "started_at", "ended_at"
    )
    jobs = [
        JobRow(0, "", "", queue, "", "", units or float(gpus), gpus, shared, "", sub, st, en)
        for queue, units, gpus, shared, sub, st, en in rows.iterator(chunk_size=10_000)
    ]
    waits_by_queue: dict[str, list[float]] = defaultdict(list)
    for job in jobs:
        if job.started is not None and period.start <= job.started < period.end:
            waits_by_queue[job.queue].append((job.started - job.submitted).total_seconds() / 3600)
    unmet_demand(jobs, capacity, period.start, end, weeks)
    return [
        WaitLine(q, len(w), sum(w) / len(w), percentile(w, 50), percentile(w, 95))
        for q, w in sorted(waits_by_queue.items())
    ]


def usage_report(*, period: Period, viewer: User, now: dt.datetime | None = None) -> UsageReport:
    """The usage report of `period` as `viewer` may see it.

    Staff see every line; anyone else sees the lab totals, the lab-wide tables (queues,
    nodes, GPU models, waits, weeks) and only their own user and booking lines.
    """
    now = now or timezone.now()
    end = min(period.end, max(now, period.start))
    capacity = Gpu.objects.filter(kind=Gpu.Kind.WHOLE).count()
    windows = telemetry_windows(start=period.start, end=end)
    totals, tables = _usage_tables(period, end, windows)
    spent, spent_total = _credits(period)
    for dimension, values in spent.items():
        for value, amount in values.items():
            tables[dimension].setdefault(value, UsageLine(value)).credits += amount
    totals.credits = spent_total
    weeks = _usage_weeks(period, end, capacity, windows)
    waits = _waits_and_demand(period, end, capacity, weeks)

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

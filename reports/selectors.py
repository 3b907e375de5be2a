"""The usage report of a period: read from jobs, credits, reservations and telemetry.

Figures are GPU-hours of whole GPUs (a shared slot counts as its share of its GPU).
"Really used" GPU-hours come from telemetry (`reports.utilisation`: hourly rollups, then
minute rollups, then raw samples for what the rollups have not reached); GPU-hours
without telemetry count as allocated but not in the used figure or the mean utilisation.

The jobs are read once, as one row of numbers per job (`JobTable`: packed as float8 by
PostgreSQL), and every figure of the jobs comes from that array: allocated GPU-hours and
final states per (owner, queue, node, GPU), per week, waits (percentiles need every
wait) and unmet demand (a sweep over time). Telemetry and credits are summed by the
database per group (the rollups per dimension and per bucket, the ledger per dimension).
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np
from django.db import connection, transaction
from django.db.models import (
    Case,
    Count,
    F,
    FloatField,
    Func,
    IntegerField,
    OuterRef,
    Q,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Cast, Coalesce, NullIf
from django.utils import timezone

from accounts.models import LedgerEntry, User
from cluster.models import Gpu, Node
from jobqueue.models import Allocation, Job, Queue
from reports.periods import Period
from reports.utilisation import (
    TelemetryWindows,
    raw_job_means,
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
        # EXTRACT gives a numeric since PostgreSQL 14 (and a cast of it costs as much);
        # date_part computes the same float8 directly, three times faster over a year's jobs.
        return self.as_sql(compiler, connection, template="date_part('epoch', %(expressions)s)")

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(
            compiler, connection, template="((julianday(%(expressions)s) - 2440587.5) * 86400.0)"
        )


def _runs_in(lo: dt.datetime, hi: dt.datetime) -> Q:
    """Jobs that ran at some time in [lo, hi)."""
    return Q(started_at__lt=hi) & (Q(ended_at__isnull=True) | Q(ended_at__gt=lo))


def _period_jobs(period: Period, names: LabNames | None = None) -> Any:
    """Every job that waited, ran or ended in the period, with its units (whole-GPU
    equivalents held while running) and, on a node with GPUs of several models, its first
    allocated GPU (`alloc_gpu`; `LabNames.model_of` names the model of any job)."""
    first_alloc = Allocation.objects.filter(job=OuterRef("pk")).order_by("id")
    slots = Subquery(first_alloc.values("gpu__parent__shared_slots")[:1])
    return (
        Job.objects.filter(submitted_at__lt=period.end)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gte=period.start))
        .exclude(state=Job.State.HELD)
        .order_by()
        .annotate(
            alloc_gpu=_first_gpu_on_mixed_nodes(names)
            if names is not None
            else Value(None, output_field=IntegerField()),
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


DIMENSION_FIELDS = ("owner_id", "queue_id", "node_id", "alloc_gpu")
# The same as telemetry rollups reach them (the model of the GPU measured).
ROLLUP_DIMENSION_FIELDS = {
    "user": "user_id",  # the rollup keeps the job's owner: no join for it
    "queue": "job__queue_id",
    "node": "job__node_id",
    "model": "gpu__model",
}


@dataclass
class LabNames:
    """Names of the ids a report groups by. The GPU model of a job is its node's, where the
    node has GPUs of one model, else that of its first allocated GPU."""

    users: dict[int, tuple[str, str | None]]  # id → (username, category name)
    queues: dict[int, str]
    nodes: dict[int, str]
    gpu_models: dict[int, str]
    node_models: dict[int, str]
    mixed_nodes: list[int]

    def model_of(self, node_id: int | None, alloc_gpu: int | None) -> str | None:
        if alloc_gpu is not None:
            return self.gpu_models.get(alloc_gpu)
        return self.node_models.get(node_id or 0)

    def keys(
        self, user_id: int | None, queue_id: int | None, node_id: int | None, model: str | None
    ) -> tuple[str, ...]:
        """(user, category, queue, node, model) as the report's lines name them."""
        user, category = self.users.get(user_id or 0, ("", None))
        return (
            user or "—",
            category or NO_CATEGORY,
            self.queues.get(queue_id or 0) or "—",
            self.nodes.get(node_id or 0) or "—",
            model or "—",
        )


def _lab_names() -> LabNames:
    gpus = list(Gpu.objects.values_list("pk", "model", "node_id"))
    per_node: dict[int, set[str]] = defaultdict(set)
    for _pk, model, node_id in gpus:
        per_node[node_id].add(model)
    return LabNames(
        users={
            pk: (name, category)
            for pk, name, category in User.objects.values_list("pk", "username", "category__name")
        },
        queues=dict(Queue.objects.values_list("pk", "name")),
        nodes=dict(Node.objects.values_list("pk", "name")),
        gpu_models={pk: model for pk, model, _node in gpus},
        node_models={node: next(iter(m)) for node, m in per_node.items() if len(m) == 1},
        mixed_nodes=[node for node, m in per_node.items() if len(m) > 1],
    )


def _first_gpu_on_mixed_nodes(names: LabNames, job: str = "pk", node: str = "node_id") -> Any:
    """The job's first allocated GPU if it ran on a node of several models, else NULL: a
    lookup per job costs more than the rest of a report's GROUP BY, so only those pay it."""
    if not names.mixed_nodes:
        return Value(None, output_field=IntegerField())
    first = Allocation.objects.filter(job=OuterRef(job)).order_by("id").values("gpu_id")[:1]
    return Case(
        When(**{f"{node}__in": names.mixed_nodes}, then=Subquery(first)),
        default=None,
        output_field=IntegerField(),
    )


def _credits(period: Period, names: LabNames) -> tuple[dict[str, dict[str, float]], float]:
    """Credits spent in the period per dimension and value, and in total (charges net of
    refunds): one GROUP BY, rolled up into the five dimensions here."""
    entries = (
        LedgerEntry.objects.filter(
            created_at__gte=period.start, created_at__lt=period.end, kind__in=SPENDING_KINDS
        )
        .order_by()
        .annotate(gpu=_first_gpu_on_mixed_nodes(names, "job_id", "job__node_id"))
    )
    spent: dict[str, dict[str, float]] = {d: defaultdict(float) for d in DIMENSIONS}
    total = 0.0
    rows = entries.values("account__user_id", "job__queue_id", "job__node_id", "gpu").annotate(
        amount=Sum("amount")
    )
    for row in rows:
        amount = -float(row["amount"] or Decimal(0))
        total += amount
        model = names.model_of(row["job__node_id"], row["gpu"])
        keys = names.keys(row["account__user_id"], row["job__queue_id"], row["job__node_id"], model)
        # Every job has a queue: an entry without one is not a job's (a booking's, say).
        dimensions = DIMENSIONS if row["job__queue_id"] is not None else DIMENSIONS[:2]
        for dimension, key in zip(dimensions, keys, strict=False):
            spent[dimension][key] += amount
    return spent, 0.0 + total  # 0.0 + x: never a negative zero


# Columns of the job array the unmet-demand sweep reads (times in seconds since 1970;
# NaN where a job has not started or not ended).
SWEEP_COLUMNS = ("units", "gpus", "shared_slot", "submitted", "started", "ended")


def unmet_demand(
    jobs: np.ndarray,
    capacity: int,
    start: dt.datetime,
    end: dt.datetime,
    weeks: dict[dt.date, WeekLine],
) -> None:
    """GPU-hours that waited while fewer GPUs were free in the whole lab than the job asked for.

    `jobs` has one row per job and the SWEEP_COLUMNS. A sweep over the period: at each
    moment, busy = units of running jobs; every waiting job that asks for more whole GPUs
    than are free adds its GPUs to the week's figure. Vectorised: the events sorted by
    time, busy and the waiting jobs of each size as running sums, each interval between
    two events weighed at once.
    """
    grid = WeekGrid(start, end)
    week_ends = np.array([w1.timestamp() for w1 in grid.ends])
    if not len(jobs) or not len(week_ends):
        return
    t_start, t_end = start.timestamp(), end.timestamp()
    units, gpus, shared, submitted, started, ended = (jobs[:, i] for i in range(6))
    has_started = ~np.isnan(started)
    run_end = np.where(np.isnan(ended), t_end, ended)
    running = has_started & (run_end > t_start) & (np.nan_to_num(started, nan=t_end) < t_end)
    wait_end = np.where(has_started, started, run_end)
    waiting = (shared == 0) & (wait_end > t_start) & (submitted < t_end) & (wait_end > submitted)
    n_run, n_wait, n_weeks = int(running.sum()), int(waiting.sum()), len(week_ends)
    times = np.concatenate(
        [
            np.maximum(started[running], t_start),
            np.minimum(run_end[running], t_end),
            np.maximum(submitted[waiting], t_start),
            np.minimum(wait_end[waiting], t_end),
            week_ends,  # they split the intervals, so that each lies in one week
        ]
    )
    busy_delta = np.concatenate([units[running], -units[running], np.zeros(2 * n_wait + n_weeks)])
    size_of = np.concatenate(
        [np.zeros(2 * n_run), gpus[waiting], gpus[waiting], np.zeros(n_weeks)]
    ).astype(np.int64)
    step = np.concatenate(
        [np.zeros(2 * n_run), np.ones(n_wait), -np.ones(n_wait), np.zeros(n_weeks)]
    ).astype(np.int64)
    order = np.argsort(times, kind="stable")
    t, busy = times[order], np.cumsum(busy_delta[order])
    size_of, step = size_of[order], step[order]
    span = np.diff(t)  # interval i runs from event i to event i + 1, in the state after event i
    free = capacity - busy[:-1]
    short = np.zeros(len(span))
    for size in np.unique(size_of[size_of > 0]):
        queued = np.cumsum(np.where(size_of == size, step, 0))[:-1]
        short += np.where(size > free + 1e-9, size * queued, 0)
    week_index = np.searchsorted(week_ends, t[:-1], side="right")
    per_week = np.bincount(week_index, weights=short * span, minlength=n_weeks + 1)
    for (monday, _w0, _w1), seconds in zip(grid.weeks, per_week[:n_weeks], strict=True):
        week = weeks.get(monday)
        if week is not None and seconds > 0:
            week.unmet_gpu_hours += float(seconds) / 3600


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
    period: Period,
    end: dt.datetime,
    windows: TelemetryWindows,
    names: LabNames,
    raw_usage: dict[tuple[str, ...], list[float]],
    table: JobTable,
) -> tuple[UsageLine, dict[str, dict[str, UsageLine]]]:
    """Allocated GPU-hours and jobs by final state per user, category, queue, node and GPU
    model, summed per (owner, queue, node, first GPU) from the period's job table (one row
    per job, read once for every figure of the jobs); used GPU-hours from telemetry."""
    totals = UsageLine("lab")
    tables: dict[str, dict[str, UsageLine]] = {d: {} for d in DIMENSIONS}

    def lines_of(keys: tuple[str, ...]) -> list[UsageLine]:
        return [totals] + [
            tables[d].setdefault(key, UsageLine(key))
            for d, key in zip(DIMENSIONS, keys, strict=True)
        ]

    for owner, queue, node, gpu, alloc_s, counts in _job_groups(period, end, table):
        lines = lines_of(names.keys(owner, queue, node, names.model_of(node, gpu)))
        hours = alloc_s / 3600
        for line in lines:
            line.gpu_hours += hours
            for state, n in zip(FINAL_STATES, counts, strict=True):
                if n:
                    line.jobs[state] += n
    telemetry: dict[tuple[str, ...], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for (user, queue, node, model), (used, measured) in rollup_usage(
        windows, **ROLLUP_DIMENSION_FIELDS
    ).items():
        keys = names.keys(user, queue, node, model)
        telemetry[keys][0] += used
        telemetry[keys][1] += measured
    for keys, (used, measured) in raw_usage.items():
        telemetry[keys][0] += used
        telemetry[keys][1] += measured
    for keys, (used, measured) in telemetry.items():
        for line in lines_of(keys):
            line.used_gpu_hours += used
            line.measured_gpu_hours += measured
    return totals, tables


def _usage_weeks(
    period: Period,
    end: dt.datetime,
    capacity: int,
    windows: TelemetryWindows,
    raw_weeks: dict[dt.date, float],
    jobs: np.ndarray,
) -> dict[dt.date, WeekLine]:
    """Capacity, allocated and used GPU-hours per week; used from the rollups per bucket.

    Allocated, from `jobs` (SWEEP_COLUMNS, one row per job of the period): a run clipped
    to the period, [s, e), gives week [w0, w1) the GPU-hours clamp(e) - clamp(s), where
    clamp(x) = min(max(x, w0), w1). Summed over runs, each side needs only, per week that
    x falls in, the units and the units times x: runs whose x is in an earlier week add
    units * w0, in the week units * x, in a later week units * w1. Exact however long
    the runs, and one pass over the jobs the report reads anyway.
    """
    grid = WeekGrid(period.start, end)
    weeks = {monday: WeekLine(monday) for monday, _w0, _w1 in grid.weeks}
    for monday, w0, w1 in grid.weeks:
        weeks[monday].capacity_gpu_hours = capacity * (w1 - w0).total_seconds() / 3600
    if grid.weeks and len(jobs):
        # Seconds from the period's start: small numbers keep the sums exact to the µs.
        t0 = period.start.timestamp()
        lo = np.array([w0.timestamp() - t0 for _m, w0, _w1 in grid.weeks])
        hi = np.array([w1.timestamp() - t0 for _m, _w0, w1 in grid.weeks])
        t_end = end.timestamp() - t0
        units, started, ended = jobs[:, 0], jobs[:, 4] - t0, jobs[:, 5] - t0
        runs = ~np.isnan(started) & (started < t_end) & (np.isnan(ended) | (ended > 0))
        u = units[runs]
        began = np.maximum(started[runs], 0.0)
        stopped = np.minimum(np.where(np.isnan(ended[runs]), t_end, ended[runs]), t_end)
        n = len(lo)

        def clamped_sum(x: np.ndarray) -> np.ndarray:
            k = np.searchsorted(hi, x, side="right")  # the week x falls in (n: after all)
            per_week_u = np.bincount(k, weights=u, minlength=n + 1)
            per_week_ux = np.bincount(k, weights=u * x, minlength=n + 1)
            before = np.cumsum(per_week_u)[:n] - per_week_u[:n]  # x in an earlier week
            after = u.sum() - np.cumsum(per_week_u)[:n]  # x in a later week
            return before * lo + per_week_ux[:n] + after * hi

        allocated = np.maximum(0.0, clamped_sum(stopped) - clamped_sum(began)) / 3600
        for (monday, _w0, _w1), hours in zip(grid.weeks, allocated, strict=True):
            weeks[monday].gpu_hours = float(hours)
    for monday, used in [*rollup_usage_by_week(windows, grid).items(), *raw_weeks.items()]:
        if monday in weeks:
            weeks[monday].used_gpu_hours += used
    return weeks


def _raw_usage(
    period: Period, end: dt.datetime, windows: TelemetryWindows, names: LabNames
) -> tuple[dict[tuple[str, ...], list[float]], dict[dt.date, float]]:
    """Used and measured GPU-hours of the part no rollup covers yet, per dimension key and
    used per week: each job's mean raw utilisation there weighs its GPU-hours there."""
    if windows.raw is None:
        return {}, {}
    means = raw_job_means(windows.raw)
    if not means:
        return {}, {}
    a, b = windows.raw
    grid = WeekGrid(period.start, end)
    rows = (
        _period_jobs(period, names)
        .filter(_runs_in(a, b))
        .values_list("pk", "units", "started_at", "ended_at", *DIMENSION_FIELDS)
    )
    by_key: dict[tuple[str, ...], list[float]] = {}
    by_week: dict[dt.date, float] = defaultdict(float)
    for pk, units, started, ended, user, queue, node, gpu in rows.iterator(chunk_size=10_000):
        mean = means.get(pk)
        if mean is None or started is None:
            continue
        run_end = ended or b
        hours = units * _overlap_h(started, run_end, a, b)
        keys = names.keys(user, queue, node, names.model_of(node, gpu))
        line_sums = by_key.setdefault(keys, [0.0, 0.0])
        line_sums[0] += hours * mean
        line_sums[1] += hours
        r0, r1 = max(started, a), min(run_end, b)
        for monday, w0, w1 in grid.spanning(r0, r1):
            by_week[monday] += units * _overlap_h(r0, r1, w0, w1) * mean
    return by_key, by_week


@dataclass
class JobTable:
    """The period's jobs as numbers, one row per job: `jobs` has the SWEEP_COLUMNS; `ids`
    the queue, owner, node, first GPU on a mixed node (`_period_jobs`) and the index of the
    final state in FINAL_STATES (-1 for none); NaN where a value is NULL."""

    ids: np.ndarray
    jobs: np.ndarray

    @property
    def queue_ids(self) -> np.ndarray:
        return self.ids[:, 0]


ID_COLUMNS = ("queue_id", "owner_id", "node_id", "alloc_gpu", "final_state")


def _job_table(period: Period, names: LabNames) -> JobTable:
    """Every job of the period as numbers (`JobTable`), fetched without Django's per-value
    converters (a year is 100,000 rows; see `_fetch_floats`)."""
    final_state = Case(
        *(When(state=state, then=Value(i)) for i, state in enumerate(FINAL_STATES)),
        default=Value(-1),
        output_field=IntegerField(),
    )
    query = (
        _period_jobs(period, names)
        .annotate(final_state=final_state)
        .values_list(
            *ID_COLUMNS,
            "units",
            "gpus",
            Cast("shared_slot", IntegerField()),
            EpochSeconds("submitted_at"),
            EpochSeconds("started_at"),
            EpochSeconds("ended_at"),
        )
    )
    sql, params = query.query.sql_with_params()
    table = _fetch_floats(sql, params, len(ID_COLUMNS) + len(SWEEP_COLUMNS))
    ids, jobs = table[:, : len(ID_COLUMNS)], table[:, len(ID_COLUMNS) :]
    units = jobs[:, 0]
    jobs[:, 0] = np.where(np.isnan(units), jobs[:, 1], units)
    return JobTable(ids, jobs)


def _groups_of(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of `keys` (integers) and each row's index among them, as
    `np.unique(keys, axis=0, return_inverse=True)` gives them, ten times faster: each
    column's values numbered densely, the numbers combined into one integer per row."""
    uniques, codes = [], []
    for column in keys.T:
        values, code = np.unique(column, return_inverse=True)
        uniques.append(values)
        codes.append(code.reshape(-1))
    if math.prod(len(values) for values in uniques) >= 2**62:
        groups, inverse = np.unique(keys, axis=0, return_inverse=True)
        return groups, inverse.reshape(-1)
    combined = np.zeros(len(keys), dtype=np.int64)
    for values, code in zip(uniques, codes, strict=True):
        combined = combined * len(values) + code
    distinct, inverse = np.unique(combined, return_inverse=True)
    columns = []
    for values in reversed(uniques):
        columns.append(values[distinct % len(values)])
        distinct = distinct // len(values)
    return np.column_stack(columns[::-1]), inverse.reshape(-1)


def _job_groups(
    period: Period, end: dt.datetime, table: JobTable
) -> Iterator[tuple[int | None, int | None, int | None, int | None, float, list[int]]]:
    """Per (owner, queue, node, first GPU) of the period's jobs: the allocated GPU-seconds
    of their runs clipped to [period start, end), and how many ended in the period in
    each FINAL_STATE."""
    if not len(table.jobs):
        return
    t0, t_end = period.start.timestamp(), end.timestamp()
    units, started, ended = table.jobs[:, 0], table.jobs[:, 4], table.jobs[:, 5]
    runs = ~np.isnan(started) & (started < t_end) & (np.isnan(ended) | (ended > t0))
    run_end = np.minimum(np.where(np.isnan(ended), t_end, ended), t_end)
    overlap = np.maximum(0.0, run_end - np.maximum(started, t0))
    alloc_s = np.where(runs, units * np.nan_to_num(overlap), 0.0)
    ended_in = ~np.isnan(ended) & (ended >= t0) & (ended < period.end.timestamp())
    state = np.where(ended_in, table.ids[:, 4], -1).astype(np.int64)
    groups, group_of = _groups_of(np.nan_to_num(table.ids[:, :4], nan=-1).astype(np.int64))
    n = len(groups)
    alloc = np.bincount(group_of, weights=alloc_s, minlength=n)
    counts = [np.bincount(group_of[state == i], minlength=n) for i in range(len(FINAL_STATES))]

    def key(value: int) -> int | None:
        return None if value < 0 else int(value)

    for g, (queue, owner, node, gpu) in enumerate(groups.tolist()):
        yield (
            key(owner),
            key(queue),
            key(node),
            key(gpu),
            float(alloc[g]),
            [int(c[g]) for c in counts],
        )


def _fetch_floats(sql: str, params: Any, columns: int) -> np.ndarray:
    """The rows of `sql` (every column a number or NULL) as a float array, NULL as NaN.

    On PostgreSQL the database packs every row's values as big-endian float8 (float8send)
    into one bytea, which numpy reads as it is: a fetch would make a Python tuple and a
    float per value (the largest cost of a year's report went there)."""
    if connection.vendor != "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        return np.array(rows, dtype=float).reshape(len(rows), columns)  # None becomes NaN
    names = ", ".join(f"c{i}" for i in range(columns))
    packed = " || ".join(f"float8send(COALESCE(c{i}::float8, 'NaN'))" for i in range(columns))
    statement = f"SELECT string_agg({packed}, ''::bytea) FROM ({sql}) AS t ({names})"
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        row = cursor.fetchone()
    data = bytes(row[0]) if row and row[0] is not None else b""
    return np.frombuffer(data, dtype=">f8").astype(float).reshape(-1, columns)


def _waits_and_demand(
    period: Period,
    end: dt.datetime,
    capacity: int,
    weeks: dict[dt.date, WeekLine],
    table: JobTable,
) -> list[WaitLine]:
    """Waits per queue (percentiles need every wait) and unmet demand per week (a sweep over
    the period), from the period's jobs (`_job_table`)."""
    queue_ids, jobs = table.queue_ids, table.jobs
    if not len(jobs):
        return []
    unmet_demand(jobs, capacity, period.start, end, weeks)
    started, submitted = jobs[:, 4], jobs[:, 3]
    in_period = (started >= period.start.timestamp()) & (started < period.end.timestamp())
    queue_names = dict(Queue.objects.values_list("pk", "name"))
    waits = []
    for queue_id in np.unique(queue_ids[in_period]):
        wait_h = ((started - submitted)[in_period & (queue_ids == queue_id)] / 3600).tolist()
        waits.append(
            WaitLine(
                queue_names[int(queue_id)],
                len(wait_h),
                sum(wait_h) / len(wait_h),
                percentile(wait_h, 50),
                percentile(wait_h, 95),
            )
        )
    return sorted(waits, key=lambda w: w.queue)


@contextmanager
def _without_jit() -> Iterator[None]:
    """PostgreSQL's JIT compiles a report's wide aggregates for longer than they run (2 s of
    compiling for a year's GROUP BY); the report turns it off for its own transaction."""
    if connection.vendor != "postgresql":
        yield
        return
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off")
        yield


def usage_report(*, period: Period, viewer: User, now: dt.datetime | None = None) -> UsageReport:
    """The usage report of `period` as `viewer` may see it.

    Staff see every line; anyone else sees the lab totals, the lab-wide tables (queues,
    nodes, GPU models, waits, weeks) and only their own user and booking lines.
    """
    with _without_jit():
        return _usage_report(period=period, viewer=viewer, now=now)


def _usage_report(*, period: Period, viewer: User, now: dt.datetime | None) -> UsageReport:
    now = now or timezone.now()
    end = min(period.end, max(now, period.start))
    capacity = Gpu.objects.filter(kind=Gpu.Kind.WHOLE).count()
    windows = telemetry_windows(start=period.start, end=end)
    names = _lab_names()
    raw_by_key, raw_by_week = _raw_usage(period, end, windows, names)
    table = _job_table(period, names)
    totals, tables = _usage_tables(period, end, windows, names, raw_by_key, table)
    spent, spent_total = _credits(period, names)
    for dimension, values in spent.items():
        for value, amount in values.items():
            tables[dimension].setdefault(value, UsageLine(value)).credits += amount
    totals.credits = spent_total
    weeks = _usage_weeks(period, end, capacity, windows, raw_by_week, table.jobs)
    waits = _waits_and_demand(period, end, capacity, weeks, table)

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

"""Reads of GPU history that pages, the API, reports and alerts share.

Rows come from the rollups (`GpuMinuteRollup`, `GpuHourRollup`); each hour row names
the job (and its owner) that held the GPU for most of that hour, and its
`held_minutes`, so a job's or user's GPU-hours are `sum(held_minutes) / 60`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.db.models import F, FloatField, Func, Max, Q, QuerySet, Sum
from django.db.models.functions import Floor, TruncDate

from cluster.models import Gpu
from telemetry.models import GpuHourRollup, GpuMinuteRollup
from telemetry.rollups import floor_to


@dataclass(frozen=True)
class Usage:
    """Aggregated hourly usage of one GPU, job or user over a period."""

    key: int
    gpu_hours: float
    util_mean: float | None  # weighted by samples; for a job or user, over the hours it held
    util_max: float | None
    mem_used_max_mb: int | None
    temp_max_c: float | None


def hours_between(
    *,
    start: datetime,
    end: datetime,
    gpu_ids: Iterable[int] | None = None,
    job_ids: Iterable[int] | None = None,
    user_ids: Iterable[int] | None = None,
) -> QuerySet[GpuHourRollup]:
    """Hour rows whose hour starts in [start, end), optionally only these GPUs, jobs or users."""
    rows = GpuHourRollup.objects.filter(bucket__gte=start, bucket__lt=end)
    if gpu_ids is not None:
        rows = rows.filter(gpu_id__in=list(gpu_ids))
    if job_ids is not None:
        rows = rows.filter(job_id__in=list(job_ids))
    if user_ids is not None:
        rows = rows.filter(user_id__in=list(user_ids))
    return rows


def minutes_between(
    *,
    start: datetime,
    end: datetime,
    gpu_ids: Iterable[int] | None = None,
    job_ids: Iterable[int] | None = None,
) -> QuerySet[GpuMinuteRollup]:
    """Minute rows whose minute starts in [start, end) (kept for the minute retention only)."""
    rows = GpuMinuteRollup.objects.filter(bucket__gte=start, bucket__lt=end)
    if gpu_ids is not None:
        rows = rows.filter(gpu_id__in=list(gpu_ids))
    if job_ids is not None:
        rows = rows.filter(job_id__in=list(job_ids))
    return rows


def _usage(rows: QuerySet[GpuHourRollup], key: str, held: str = "held_minutes") -> list[Usage]:
    grouped = (
        rows.filter(**{f"{key}__isnull": False})
        .values(key)
        .annotate(
            held=Sum(held),
            util_weighted=Sum(F("util_mean") * F("samples")),
            weight=Sum("samples", filter=Q(util_mean__isnull=False)),
            util_max_=Max("util_max"),
            mem_max=Max("mem_used_max_mb"),
            temp_max=Max("temp_max_c"),
        )
        .order_by(key)
    )
    return [
        Usage(
            key=row[key],
            gpu_hours=(row["held"] or 0) / 60,
            util_mean=row["util_weighted"] / row["weight"] if row["weight"] else None,
            util_max=row["util_max_"],
            mem_used_max_mb=row["mem_max"],
            temp_max_c=row["temp_max"],
        )
        for row in grouped
    ]


def usage_per_gpu(
    *, start: datetime, end: datetime, gpu_ids: Iterable[int] | None = None
) -> list[Usage]:
    """Per GPU over [start, end): hours held by any job, mean and peak utilisation (idle too)."""
    return _usage(hours_between(start=start, end=end, gpu_ids=gpu_ids), "gpu_id", "busy_minutes")


def usage_per_job(
    *, start: datetime, end: datetime, job_ids: Iterable[int] | None = None
) -> list[Usage]:
    """Per job over [start, end): the GPU-hours it held and how busy it kept them."""
    return _usage(hours_between(start=start, end=end, job_ids=job_ids), "job_id")


def usage_per_user(
    *, start: datetime, end: datetime, user_ids: Iterable[int] | None = None
) -> list[Usage]:
    """Per user over [start, end): the GPU-hours their jobs held and how busy they kept them."""
    return _usage(hours_between(start=start, end=end, user_ids=user_ids), "user_id")


# --- Chart series -------------------------------------------------------------


class EpochSeconds(Func):
    """Seconds since 1970 of a timestamp, on PostgreSQL and SQLite."""

    output_field = FloatField()
    template = "EXTRACT(EPOCH FROM %(expressions)s)"

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(
            compiler,
            connection,
            template="CAST(strftime('%%%%s', %(expressions)s) AS REAL)",
            **extra,
        )


MAX_POINTS = 2000
DEFAULT_POINTS = 400


@dataclass(frozen=True)
class GpuLine:
    """One GPU's chart line: utilisation (mean, %) and memory used (peak, MiB) per bin."""

    gpu_id: int
    label: str
    node: str
    memory_mb: int
    util: list[float | None]
    mem_used_mb: list[int | None]


@dataclass(frozen=True)
class NodeLine:
    """A node's chart line: mean utilisation of its GPUs and the memory they used per bin."""

    node: str
    util: list[float | None]
    mem_used_mb: list[int | None]
    memory_mb: int


@dataclass(frozen=True)
class Series:
    """Aligned lines: every list has one value per entry of `timestamps` (bin starts)."""

    resolution: str  # "minute" or "hour": the rollup the bins were made from
    step_s: int
    timestamps: list[int]
    gpus: list[GpuLine]
    nodes: list[NodeLine]


def _resolution(start: datetime, end: datetime, now: datetime) -> str:
    """Minutes for short, recent ranges (kept 30 days by default), hours for the rest."""
    from telemetry.models import RetentionPolicy

    minute_floor = now - timedelta(days=RetentionPolicy.current().minute_days)
    return "minute" if end - start <= timedelta(days=2) and start >= minute_floor else "hour"


def gpu_series(
    *,
    start: datetime,
    end: datetime,
    gpus: Iterable[Gpu],
    points: int = DEFAULT_POINTS,
    now: datetime,
) -> Series:
    """Utilisation and memory of `gpus` (and of their nodes) over [start, end), at most `points` bins.

    One query reads the rollup rows; bins wider than the rollup merge them (mean
    utilisation weighted by samples, peak memory).
    """
    resolution = _resolution(start, end, now)
    unit = 60 if resolution == "minute" else 3600
    span = (end - start).total_seconds()
    step = max(unit, math.ceil(span / max(1, points) / unit) * unit)
    start = floor_to(start, timedelta(seconds=unit))
    count = max(1, math.ceil((end - start).total_seconds() / step))
    gpu_list = list(gpus)
    model = GpuMinuteRollup if resolution == "minute" else GpuHourRollup
    util_sum: dict[int, list[float]] = {g.pk: [0.0] * count for g in gpu_list}
    util_weight: dict[int, list[int]] = {g.pk: [0] * count for g in gpu_list}
    mem: dict[int, list[int | None]] = {g.pk: [None] * count for g in gpu_list}
    # The database bins the rows: a year of one node's hours is 70,000 rows, 3,200 bins.
    bins = (
        model._default_manager.filter(bucket__gte=start, bucket__lt=end, gpu_id__in=list(util_sum))
        .annotate(bin=Floor((EpochSeconds("bucket") - start.timestamp()) / step))
        .values("gpu_id", "bin")
        .annotate(
            util_total=Sum(F("util_mean") * F("samples")),
            weight=Sum("samples", filter=Q(util_mean__isnull=False)),
            mem_max=Max("mem_used_max_mb"),
        )
        .order_by()
    )
    for row in bins:
        index, gpu_id = int(row["bin"]), row["gpu_id"]
        if not 0 <= index < count:
            continue
        util_sum[gpu_id][index] = row["util_total"] or 0.0
        util_weight[gpu_id][index] = row["weight"] or 0
        mem[gpu_id][index] = row["mem_max"]

    lines = [
        GpuLine(
            gpu_id=gpu.pk,
            label=gpu.label,
            node=gpu.node.name,
            memory_mb=gpu.memory_mb,
            util=[
                round(total / weight, 2) if weight else None
                for total, weight in zip(util_sum[gpu.pk], util_weight[gpu.pk], strict=True)
            ],
            mem_used_mb=mem[gpu.pk],
        )
        for gpu in gpu_list
    ]
    nodes: dict[str, list[GpuLine]] = {}
    for line in lines:
        nodes.setdefault(line.node, []).append(line)
    node_lines = []
    for name, members in nodes.items():
        util_total, util_weights = [0.0] * count, [0] * count
        mem_total: list[int | None] = [None] * count
        for gpu in members:
            for i in range(count):
                weight = util_weight[gpu.gpu_id][i]
                util_total[i] += util_sum[gpu.gpu_id][i]
                util_weights[i] += weight
                used = gpu.mem_used_mb[i]
                if used is not None:
                    mem_total[i] = (mem_total[i] or 0) + used
        node_lines.append(
            NodeLine(
                node=name,
                util=[
                    round(t / w, 2) if w else None
                    for t, w in zip(util_total, util_weights, strict=True)
                ],
                mem_used_mb=mem_total,
                memory_mb=sum(g.memory_mb for g in members),
            )
        )
    first = int(start.timestamp())
    return Series(
        resolution=resolution,
        step_s=step,
        timestamps=[first + i * step for i in range(count)],
        gpus=lines,
        nodes=node_lines,
    )


@dataclass(frozen=True)
class LabDay:
    """One day of the lab: share of GPU time allocated to jobs, and mean real utilisation."""

    day: date
    allocated_share: float | None
    util_mean: float | None
    gpu_hours: float


def lab_daily(*, start: date, end: date) -> list[LabDay]:
    """Per day in [start, end): allocated share of GPU-minutes with readings, mean utilisation."""
    rows = (
        GpuHourRollup.objects.filter(
            bucket__gte=datetime.combine(start, time.min, tzinfo=UTC),
            bucket__lt=datetime.combine(end, time.min, tzinfo=UTC),
        )
        .annotate(day=TruncDate("bucket", tzinfo=UTC))
        .values("day")
        .annotate(
            minutes_=Sum("minutes"),
            busy=Sum("busy_minutes"),
            util_weighted=Sum(F("util_mean") * F("samples")),
            weight=Sum("samples", filter=Q(util_mean__isnull=False)),
        )
        .order_by("day")
    )
    by_day = {row["day"]: row for row in rows}
    days = []
    day = start
    while day < end:
        row = by_day.get(day)
        minutes = row["minutes_"] if row else 0
        days.append(
            LabDay(
                day=day,
                allocated_share=round(row["busy"] / minutes, 4) if row and minutes else None,
                util_mean=round(row["util_weighted"] / row["weight"], 2)
                if row and row["weight"]
                else None,
                gpu_hours=round((row["busy"] if row else 0) / 60, 2),
            )
        )
        day += timedelta(days=1)
    return days

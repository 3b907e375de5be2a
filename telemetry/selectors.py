"""Reads of GPU history that pages, the API, reports and alerts share.

Rows come from the rollups (`GpuMinuteRollup`, `GpuHourRollup`); each hour row names
the job (and its owner) that held the GPU for most of that hour, and its
`held_minutes`, so a job's or user's GPU-hours are `sum(held_minutes) / 60`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db.models import F, Max, Q, QuerySet, Sum

from telemetry.models import GpuHourRollup, GpuMinuteRollup


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

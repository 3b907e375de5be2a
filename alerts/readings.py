"""What the rules read: per-GPU aggregates over a window, and each GPU's latest sample.

`gpu_windows` is the one place that reads the raw `telemetry.GpuSample` rows; when
the 1-minute rollups land, it reads them instead and nothing else changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, F, Max, Min

from telemetry.models import GpuSample


@dataclass(frozen=True, slots=True)
class GpuWindow:
    """One GPU's readings between `since` and now."""

    gpu_id: int
    samples: int
    first_ts: datetime
    last_ts: datetime
    max_util: float | None
    min_mem_mb: int | None
    min_temp_c: float | None
    max_temp_c: float | None
    ecc_low: int | None
    ecc_high: int | None
    xid_low: int | None
    xid_high: int | None


@dataclass(frozen=True, slots=True)
class LatestSample:
    gpu_id: int
    ts: datetime
    mem_used_mb: int | None
    mem_total_mb: int | None
    processes: list[dict[str, Any]]


def gpu_windows(*, since: datetime) -> dict[int, GpuWindow]:
    """Every GPU's aggregates over [since, now], one query."""
    rows = (
        GpuSample.objects.filter(ts__gte=since)
        .values("gpu_id")
        .annotate(
            n=Count("id"),
            first=Min("ts"),
            last=Max("ts"),
            max_util=Max("util_pct"),
            min_mem=Min("mem_used_mb"),
            min_temp=Min("temp_c"),
            max_temp=Max("temp_c"),
            ecc_low=Min("ecc_errors"),
            ecc_high=Max("ecc_errors"),
            xid_low=Min("xid_errors"),
            xid_high=Max("xid_errors"),
        )
        .order_by()
    )
    return {
        row["gpu_id"]: GpuWindow(
            gpu_id=row["gpu_id"],
            samples=row["n"],
            first_ts=row["first"],
            last_ts=row["last"],
            max_util=row["max_util"],
            min_mem_mb=row["min_mem"],
            min_temp_c=row["min_temp"],
            max_temp_c=row["max_temp"],
            ecc_low=row["ecc_low"],
            ecc_high=row["ecc_high"],
            xid_low=row["xid_low"],
            xid_high=row["xid_high"],
        )
        for row in rows
    }


def gpu_latest_samples(*, since: datetime) -> dict[int, LatestSample]:
    """Each GPU's newest sample (the one `cluster.Gpu.sampled_at` points at), if newer than `since`."""
    rows = GpuSample.objects.filter(ts=F("gpu__sampled_at"), ts__gte=since).values_list(
        "gpu_id", "ts", "mem_used_mb", "mem_total_mb", "processes"
    )
    return {
        gpu_id: LatestSample(
            gpu_id=gpu_id, ts=ts, mem_used_mb=used, mem_total_mb=total, processes=processes or []
        )
        for gpu_id, ts, used, total, processes in rows
    }

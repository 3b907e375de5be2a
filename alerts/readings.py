"""What the rules read: per-GPU aggregates over a window, and each GPU's latest sample.

`gpu_windows` is the one place that reads measurements over a window. Utilisation
over a long window (the idle rule: 10 minutes and more) comes from the 1-minute
rollups (`telemetry.GpuMinuteRollup`); short windows, and the metrics the rollups do
not keep (minimum memory and temperature, error counters), come from the raw
samples, all the windows of one evaluation in one scan.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, F, Max, Min, Q, Sum

from telemetry.models import GpuMinuteRollup, GpuSample

# Windows at least this long read utilisation from the minute rollups; a shorter one
# needs the raw samples' resolution (a minute bucket is only complete once it ends).
ROLLUP_MIN_WINDOW = timedelta(minutes=10)


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


# Always read: how many samples, and the span they cover.
BASE_METRICS = ("n", "first", "last")
METRIC_GROUPS = {
    "util": ("max_util",),
    "mem": ("min_mem",),
    "temp": ("min_temp", "max_temp"),
    "errors": ("ecc_low", "ecc_high", "xid_low", "xid_high"),
}


def gpu_windows(
    *, since: Mapping[datetime, Collection[str]], now: datetime
) -> dict[datetime, dict[int, GpuWindow]]:
    """Every GPU's aggregates over [start, now] for each start.

    `since` maps each window's start to the metric groups wanted there (keys of
    `METRIC_GROUPS`); a metric not asked for is None. A long window that wants only
    utilisation reads the minute rollups; the rest share one scan of the raw samples.
    """
    from_rollups = {
        start: groups
        for start, groups in since.items()
        if set(groups) == {"util"} and now - start >= ROLLUP_MIN_WINDOW
    }
    out = {start: _rollup_window(start) for start in from_rollups}
    out.update(_raw_windows({s: g for s, g in since.items() if s not in from_rollups}))
    return out


def _rollup_window(start: datetime) -> dict[int, GpuWindow]:
    rows = (
        GpuMinuteRollup.objects.filter(bucket__gte=start)
        .values("gpu_id")
        .annotate(n=Sum("samples"), first=Min("bucket"), last=Max("bucket"), peak=Max("util_max"))
        .order_by()
    )
    return {
        row["gpu_id"]: GpuWindow(
            gpu_id=row["gpu_id"],
            samples=row["n"] or 0,
            first_ts=row["first"],
            # A bucket covers its whole minute.
            last_ts=row["last"] + timedelta(minutes=1),
            max_util=row["peak"],
            min_mem_mb=None,
            min_temp_c=None,
            max_temp_c=None,
            ecc_low=None,
            ecc_high=None,
            xid_low=None,
            xid_high=None,
        )
        for row in rows
    }


def _raw_windows(since: Mapping[datetime, Collection[str]]) -> dict[datetime, dict[int, GpuWindow]]:
    starts = sorted(since)
    if not starts:
        return {}
    metrics = {
        "n": (Count, "id"),
        "first": (Min, "ts"),
        "last": (Max, "ts"),
        "max_util": (Max, "util_pct"),
        "min_mem": (Min, "mem_used_mb"),
        "min_temp": (Min, "temp_c"),
        "max_temp": (Max, "temp_c"),
        "ecc_low": (Min, "ecc_errors"),
        "ecc_high": (Max, "ecc_errors"),
        "xid_low": (Min, "xid_errors"),
        "xid_high": (Max, "xid_errors"),
    }
    aggregates = {}
    for i, start in enumerate(starts):
        wanted = set(BASE_METRICS).union(*(METRIC_GROUPS[g] for g in since[start]))
        for name in wanted:
            function, column = metrics[name]
            aggregates[f"{name}_{i}"] = function(column, filter=Q(ts__gte=start))
    rows = (
        GpuSample.objects.filter(ts__gte=starts[0])
        .values("gpu_id")
        .annotate(**aggregates)
        .order_by()
    )
    out: dict[datetime, dict[int, GpuWindow]] = {start: {} for start in starts}
    for row in rows:
        for i, start in enumerate(starts):
            if not row[f"n_{i}"]:
                continue
            out[start][row["gpu_id"]] = GpuWindow(
                gpu_id=row["gpu_id"],
                samples=row[f"n_{i}"],
                first_ts=row[f"first_{i}"],
                last_ts=row[f"last_{i}"],
                max_util=row.get(f"max_util_{i}"),
                min_mem_mb=row.get(f"min_mem_{i}"),
                min_temp_c=row.get(f"min_temp_{i}"),
                max_temp_c=row.get(f"max_temp_{i}"),
                ecc_low=row.get(f"ecc_low_{i}"),
                ecc_high=row.get(f"ecc_high_{i}"),
                xid_low=row.get(f"xid_low_{i}"),
                xid_high=row.get(f"xid_high_{i}"),
            )
    return out


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

"""Where the reports read how hard the GPUs really worked.

"Really used" GPU-hours come from telemetry, read from the coarsest source that covers
each part of a period:

- the hourly rollups, up to the hour rollup's cursor (everything older than an hour or
  so, kept for good): each GPU-hour names the job that held the GPU for most of it, and
  counts `held_minutes / 60` GPU-hours at the hour's mean utilisation;
- the minute rollups from there up to the minute rollup's cursor (the last hour): each
  GPU-minute held by a job counts 1/60 GPU-hour at that minute's utilisation;
- raw samples for the rest (the last minute or two; or the whole period where the
  rollups have never run, as on a lab without the periodic tasks): a job's mean sampled
  utilisation weighs its allocated GPU-hours in that part.

"Measured" GPU-hours are the ones that have a utilisation reading; the mean utilisation
of a line is used / measured, so GPU-hours without telemetry lower neither figure.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.db.models import (
    Avg,
    ExpressionWrapper,
    F,
    FloatField,
    IntegerField,
    QuerySet,
    Sum,
    Value,
)

from reports.sql import EpochSeconds
from telemetry.models import GpuHourRollup, GpuMinuteRollup, GpuSample, RollupCursor

Window = tuple[dt.datetime, dt.datetime]


@dataclass(frozen=True)
class TelemetryWindows:
    """Which source covers which part of [start, end); None where a source covers nothing."""

    hours: Window | None
    minutes: Window | None
    raw: Window | None


def telemetry_windows(*, start: dt.datetime, end: dt.datetime) -> TelemetryWindows:
    """Split [start, end) at the rollup cursors: hourly rollups, then minutes, then raw."""
    cursors = dict(RollupCursor.objects.values_list("level", "done_until"))

    def clamp(moment: dt.datetime | None, low: dt.datetime) -> dt.datetime:
        return min(max(moment or low, low), end)

    hour_cut = clamp(cursors.get(RollupCursor.Level.HOUR), start)
    minute_cut = clamp(cursors.get(RollupCursor.Level.MINUTE), hour_cut)

    def window(a: dt.datetime, b: dt.datetime) -> Window | None:
        return (a, b) if a < b else None

    return TelemetryWindows(
        hours=window(start, hour_cut),
        minutes=window(hour_cut, minute_cut),
        raw=window(minute_cut, end),
    )


def _rollup_rows(windows: TelemetryWindows) -> list[tuple[QuerySet[Any], float, float]]:
    """Rollup rows held by a job with a reading, annotated with `used_x` and `measured_x`,
    each with the factor that turns its sum into GPU-hours. The database sums plain float
    and integer columns (utilisation % × held minutes, held minutes) and the factors apply
    once per group: a division per row in SQL costs more than the rest of the sum."""
    rows: list[tuple[QuerySet[Any], float, float]] = []
    if windows.hours is not None:
        a, b = windows.hours
        rows.append(
            (
                GpuHourRollup.objects.filter(
                    bucket__gte=a, bucket__lt=b, job__isnull=False, util_mean__isnull=False
                )
                .order_by()
                .annotate(
                    used_x=ExpressionWrapper(
                        F("util_mean") * F("held_minutes"), output_field=FloatField()
                    ),
                    measured_x=F("held_minutes"),
                ),
                1 / 6000.0,  # % × minutes → GPU-hours
                1 / 60.0,  # minutes → hours
            )
        )
    if windows.minutes is not None:
        a, b = windows.minutes
        rows.append(
            (
                GpuMinuteRollup.objects.filter(
                    bucket__gte=a, bucket__lt=b, job__isnull=False, util_mean__isnull=False
                )
                .order_by()
                .annotate(
                    used_x=F("util_mean"),
                    measured_x=Value(1, output_field=IntegerField()),
                ),
                1 / 6000.0,  # one minute at x % is x / 6000 GPU-hours
                1 / 60.0,
            )
        )
    return rows


def rollup_usage(windows: TelemetryWindows, **group: Any) -> dict[tuple[Any, ...], list[float]]:
    """Used and measured GPU-hours from the rollups, summed in SQL per `group`
    (name → field path or expression, e.g. `user="job__owner__username"`)."""
    names = list(group)
    totals: dict[tuple[Any, ...], list[float]] = {}
    for rows, used_factor, measured_factor in _rollup_rows(windows):
        grouped = (
            rows.annotate(
                **{f"g_{n}": e if not isinstance(e, str) else F(e) for n, e in group.items()}
            )
            .values(*(f"g_{n}" for n in names))
            .annotate(used=Sum("used_x"), measured=Sum("measured_x"))
        )
        for row in grouped:
            key = tuple(row[f"g_{n}"] for n in names)
            line = totals.setdefault(key, [0.0, 0.0])
            line[0] += (row["used"] or 0.0) * used_factor
            line[1] += (row["measured"] or 0) * measured_factor
    return totals


def rollup_usage_by_week(
    windows: TelemetryWindows, grid: Any
) -> dict[dt.date, tuple[float, float]]:
    """Used and measured GPU-hours from the rollups per week of `grid` (a `reports.weeks.WeekGrid`):
    summed per bucket (an hour or a minute) in SQL, the buckets fetched as seconds since
    1970 and put in their weeks here, cheaper than truncating every row to its week."""
    usage = rollup_usage(windows, t=EpochSeconds("bucket"))
    if not usage or not grid.weeks:
        return {}
    seconds = np.round(np.array([t for (t,) in usage]))  # buckets are whole minutes
    used = np.array([u for u, _measured in usage.values()])
    measured = np.array([m for _used, m in usage.values()])
    ends = np.array([w1.timestamp() for w1 in grid.ends])
    starts = np.array([w0.timestamp() for _m, w0, _w1 in grid.weeks])
    index = np.searchsorted(ends, seconds, side="right")  # the week that ends after it
    inside = (index < len(ends)) & (seconds >= starts[np.minimum(index, len(ends) - 1)])
    per_week = np.bincount(index[inside], weights=used[inside], minlength=len(ends))
    measured_per_week = np.bincount(index[inside], weights=measured[inside], minlength=len(ends))
    return {
        monday: (float(value), float(covered))
        for (monday, _w0, _w1), value, covered, hit in zip(
            grid.weeks,
            per_week,
            measured_per_week,
            np.bincount(index[inside], minlength=len(ends)) > 0,
            strict=True,
        )
        if hit
    }


def raw_job_means(window: Window) -> dict[int, float]:
    """Each job's mean sampled utilisation (0..1) in `window`, from the raw samples."""
    a, b = window
    rows = (
        GpuSample.objects.filter(ts__gte=a, ts__lt=b, job_id__isnull=False, util_pct__isnull=False)
        .order_by()
        .values("job_id")
        .annotate(mean=Avg("util_pct"))
    )
    return {row["job_id"]: row["mean"] / 100.0 for row in rows}

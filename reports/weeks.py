"""The weeks of a report: the grid of weeks of a period, and the lab-wide figures per week
(capacity, allocated and used GPU-hours, and unmet demand, a sweep over the period)."""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Iterator

import numpy as np
from django.utils import timezone

from reports.lines import WeekLine
from reports.periods import Period
from reports.utilisation import TelemetryWindows, rollup_usage_by_week


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


def usage_weeks(
    period: Period,
    end: dt.datetime,
    capacity: int,
    windows: TelemetryWindows,
    raw_weeks: dict[dt.date, tuple[float, float]],
    jobs: np.ndarray,
) -> dict[dt.date, WeekLine]:
    """Capacity, allocated, measured and used GPU-hours per week; used and measured from
    the rollups per bucket (and raw samples past them).

    Allocated, from `jobs` (`reports.jobtable.SWEEP_COLUMNS`, one row per job of the period): a run clipped
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
    for monday, (used, measured) in [
        *rollup_usage_by_week(windows, grid).items(),
        *raw_weeks.items(),
    ]:
        if monday in weeks:
            weeks[monday].used_gpu_hours += used
            weeks[monday].measured_gpu_hours += measured
    return weeks


def unmet_demand(
    jobs: np.ndarray,
    capacity: int,
    start: dt.datetime,
    end: dt.datetime,
    weeks: dict[dt.date, WeekLine],
) -> None:
    """GPU-hours that waited while fewer GPUs were free in the whole lab than the job asked for.

    `jobs` has one row per job and the `reports.jobtable.SWEEP_COLUMNS`. A sweep over the period: at each
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

"""What a replay reports: waits, allocation, slowdown, fairness and start-estimate errors."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from scheduler.simulate.peers import PEERS
from scheduler.simulate.workload import SimJob, Workload, _unit_gpus

FAIRNESS_WINDOW_S = 86_400.0
# Policies that give no start estimates (the peers are replayed without a forecast).
NO_ESTIMATES = frozenset({"timeslots", *PEERS})


def summarize(
    jobs: Sequence[SimJob],
    workload: Workload,
    *,
    policy_name: str,
    gpus: int,
    slots_per_gpu: int,
    busy_integral: float,
    waiting_time: float,
    eta_skipped: int,
    runtime_errors: Sequence[float],
) -> dict[str, Any]:
    """The metrics of one replay (the ``--json`` object, less ``sim_seconds``)."""
    done = [j for j in jobs if j.start is not None and j.end is not None]
    waits = [_waited(j) for j in done]
    by_queue: dict[str, list[float]] = {}
    for j in done:
        by_queue.setdefault(j.queue, []).append(_waited(j))
    jct = [_end(j) - j.submit for j in done]
    slowdown = [max(1.0, (_end(j) - j.submit) / max(j.duration, 10.0)) for j in done]
    # Only jobs that waited: one started in the pass that saw it arrive is exact by
    # construction and would flatter the median.
    eta_errors = [
        abs((j.eta or 0.0) - _start(j)) for j in done if j.eta is not None and _start(j) > j.submit
    ]
    capacity = float(gpus)
    per_day = _per_day(done, slots_per_gpu)
    days = _window_jain(per_day, gpus, workload.entitlement, 1)
    weeks = _window_jain(per_day, gpus, workload.entitlement, 7)
    ftf = _finish_time_fairness(done, gpus, slots_per_gpu)
    return {
        "policy": policy_name,
        "gpus": gpus,
        "jobs": len(jobs),
        "allocation": round(busy_integral / (capacity * waiting_time), 4)
        if waiting_time > 0
        else None,
        "wait_mean_s": _round(statistics.fmean(waits)) if waits else None,
        "wait_p50_s": _round(_percentile(waits, 50)),
        "wait_p95_s": _round(_percentile(waits, 95)),
        "wait_p95_s_by_queue": {q: _round(_percentile(w, 95)) for q, w in sorted(by_queue.items())},
        "jct_mean_s": _round(statistics.fmean(jct)) if jct else None,
        "bounded_slowdown_mean": _round(statistics.fmean(slowdown), 3) if slowdown else None,
        "jain": _round(_jain(days), 4),
        "jain_contention": _round(_jain_contention(days), 4),
        # The week-horizon goal metrics: rolling 7-day windows, and Themis's ratio.
        "jain_7d_contention": _round(_jain_contention(weeks), 4),
        "ftf_worst": _round(max(ftf.values()), 3) if ftf else None,
        "ftf_median": _round(statistics.median(ftf.values()), 3) if ftf else None,
        "slowdown_fairness": _round(_slowdown_fairness(done), 4),
        "eta_error_median_s": _round(statistics.median(eta_errors))
        if eta_errors and policy_name not in NO_ESTIMATES
        else None,
        "eta_error_median_s_by_horizon": _eta_errors_by_horizon(done)
        if policy_name not in NO_ESTIMATES
        else None,
        "eta_lead_ratio_p25_p75": _lead_ratio_band(done),
        "eta_near_delay_p25_p75_s": _near_delay_band(done),
        # Arrivals whose estimate the deep-backlog sampling skipped (0: all estimated).
        "eta_skipped": eta_skipped,
        "runtime_error_median": _round(statistics.median(runtime_errors), 4)
        if runtime_errors
        else None,
        "unfinished": len(jobs) - len(done),
        "refused_too_wide": workload.refused,
        "fractional_as_whole": workload.fractional_as_whole,
        "users_source": workload.users_source,
        "window": workload.window,
    }


def _window_jain(
    per_day: Sequence[tuple[dict[str, float], dict[str, float], dict[str, float]]],
    gpus: int,
    entitlement: dict[str, float],
    days: int,
) -> list[tuple[float, float]]:
    """(Jain's index, waiting GPU-seconds) for every window of ``days`` consecutive days
    (rolling by one day; one window when the replay is shorter) with demand from two or
    more users.

    The index is over x_u = received / fair, where ``fair`` is the weighted max-min
    share of the window's capacity given each user's demand in it; the weight is the
    GPU-seconds that jobs spent waiting in it (a quiet window weighs nothing)."""
    windows: list[tuple[float, float]] = []
    for first in range(max(1, len(per_day) - days + 1)):
        span = per_day[first : first + days]
        want: dict[str, float] = {}
        got: dict[str, float] = {}
        waited = 0.0
        for demand, received, waiting in span:
            for u, v in demand.items():
                want[u] = want.get(u, 0.0) + v
            for u, v in received.items():
                got[u] = got.get(u, 0.0) + v
            waited += sum(waiting.values())
        fair = _water_fill(want, entitlement, gpus * FAIRNESS_WINDOW_S * len(span))
        xs = [got.get(u, 0.0) / f for u, f in fair.items() if f > 0]
        if len(xs) >= 2 and sum(x * x for x in xs) > 0:
            windows.append((_jain_index(xs), waited))
    return windows


def _per_day(
    done: Sequence[SimJob], slots_per_gpu: int
) -> list[tuple[dict[str, float], dict[str, float], dict[str, float]]]:
    """Per day of the replay, per user: GPU-seconds asked for (submit to end), received
    (while running) and waited (submit to first start)."""
    if not done:
        return []
    t0 = min(j.submit for j in done)
    t1 = max(_end(j) for j in done)
    windows = max(1, math.ceil((t1 - t0) / FAIRNESS_WINDOW_S))
    demand = [dict[str, float]() for _ in range(windows)]
    received = [dict[str, float]() for _ in range(windows)]
    waiting = [dict[str, float]() for _ in range(windows)]
    for j in done:
        g = _unit_gpus(j, slots_per_gpu)
        _spread(demand, j.user, j.submit, _end(j), g, t0)
        since = j.submit
        for start, end in _runs(j):
            _spread(received, j.user, start, end, g, t0)
            _spread(waiting, j.user, since, start, g, t0)
            since = end
    return list(zip(demand, received, waiting, strict=True))


def _finish_time_fairness(
    done: Sequence[SimJob], gpus: int, slots_per_gpu: int
) -> dict[str, float]:
    """Per user, Themis's finish-time fairness ratio: their jobs' time in the shared
    cluster (submit to end, summed) over their time alone on 1/N of it, N being the
    users with jobs in the cluster when each job was submitted (a job wider than 1/N of
    the GPUs runs proportionally slower there). Above 1: worse off than 1/N alone."""
    # At each instant, ends first, then submits; a job counts every user present once
    # the submits of its instant are in (its own user included).
    events = sorted(
        [(j.submit, 1, j.index, j.user) for j in done]
        + [(_end(j), -1, j.index, j.user) for j in done]
    )
    present: dict[str, int] = {}
    contenders: dict[int, int] = {}
    arrived: list[int] = []
    for k, (time, step, index, user) in enumerate(events):
        present[user] = present.get(user, 0) + step
        if present[user] == 0:
            del present[user]
        if step > 0:
            arrived.append(index)
        if k + 1 == len(events) or events[k + 1][0] != time:
            for i in arrived:
                contenders[i] = len(present)
            arrived.clear()
    shared: dict[str, float] = {}
    alone: dict[str, float] = {}
    for j in done:
        g = _unit_gpus(j, slots_per_gpu)
        ideal = j.duration * max(1.0, g * contenders.get(j.index, 1) / gpus)
        shared[j.user] = shared.get(j.user, 0.0) + _end(j) - j.submit
        alone[j.user] = alone.get(j.user, 0.0) + ideal
    return {u: shared[u] / alone[u] for u in shared if alone[u] > 0}


def _jain(days: Sequence[tuple[float, float]]) -> float | None:
    """Mean over days of the daily index (every day with demand counts the same)."""
    return statistics.fmean(i for i, _ in days) if days else None


def _jain_contention(days: Sequence[tuple[float, float]]) -> float | None:
    """The daily index weighted by that day's waiting: fairness where it was contested."""
    total = sum(w for _, w in days)
    return sum(i * w for i, w in days) / total if total > 0 else None


def _slowdown_fairness(done: Sequence[SimJob]) -> float | None:
    """Jain's index over users of 1 / their mean bounded slowdown (1.0: equal slowdowns)."""
    per_user: dict[str, list[float]] = {}
    for j in done:
        per_user.setdefault(j.user, []).append(
            max(1.0, (_end(j) - j.submit) / max(j.duration, 10.0))
        )
    xs = [1.0 / statistics.fmean(v) for v in per_user.values()]
    return _jain_index(xs) if len(xs) >= 2 else None


def _jain_index(xs: Sequence[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


HORIZONS = (("within_1h", 3600.0), ("within_1d", 86_400.0), ("later", math.inf))


def _eta_errors_by_horizon(done: Sequence[SimJob]) -> dict[str, float | None]:
    """Median |estimated - actual start| for jobs that waited, by how long they waited."""
    groups: dict[str, list[float]] = {name: [] for name, _ in HORIZONS}
    for j in done:
        if j.eta is None or _start(j) <= j.submit:
            continue
        wait = _start(j) - j.submit
        name = next(n for n, limit in HORIZONS if wait <= limit)
        groups[name].append(abs(j.eta - _start(j)))
    return {n: _round(statistics.median(v)) if v else None for n, v in groups.items()}


def _lead_ratio_band(done: Sequence[SimJob]) -> tuple[float, float] | None:
    """For jobs estimated to wait over an hour: the quartiles of actual wait / estimated
    wait (what the portal's "likely between" range is drawn from: half the jobs)."""
    ratios = [
        (_start(j) - j.submit) / (j.eta - j.submit)
        for j in done
        if j.eta is not None and j.eta - j.submit > LONG_LEAD_S
    ]
    if len(ratios) < 10:
        return None
    low, high = _percentile(ratios, 25), _percentile(ratios, 75)
    assert low is not None and high is not None
    return (round(low, 3), round(high, 3))


LONG_LEAD_S = 3600.0


def _near_delay_band(done: Sequence[SimJob]) -> tuple[float, float] | None:
    """For jobs estimated to start within the hour: the quartiles of actual start minus
    estimated start, in seconds (what the portal's range for near estimates is drawn
    from). By the estimate's lead, as the member sees it, not by the wait it turned into."""
    delays = [
        _start(j) - j.eta for j in done if j.eta is not None and 0 < j.eta - j.submit <= LONG_LEAD_S
    ]
    if len(delays) < 10:
        return None
    low, high = _percentile(delays, 25), _percentile(delays, 75)
    assert low is not None and high is not None
    return (round(low), round(high))


def _runs(job: SimJob) -> tuple[tuple[float, float], ...]:
    """The stretches a job ran: one, from start to end, unless it was preempted."""
    return job.runs or ((_start(job), _end(job)),)


def _waited(job: SimJob) -> float:
    """Time a job spent waiting: before its start and, if preempted, between stretches
    (so a policy that starts every job at once and preempts it later gains nothing)."""
    return _end(job) - job.submit - sum(end - start for start, end in _runs(job))


def _start(job: SimJob) -> float:
    assert job.start is not None
    return job.start


def _end(job: SimJob) -> float:
    assert job.end is not None
    return job.end


def _spread(
    windows: list[dict[str, float]], user: str, start: float, end: float, gpus: float, t0: float
) -> None:
    first = int((start - t0) // FAIRNESS_WINDOW_S)
    last = min(len(windows) - 1, int((end - t0) // FAIRNESS_WINDOW_S))
    for w in range(first, last + 1):
        lo = max(start, t0 + w * FAIRNESS_WINDOW_S)
        hi = min(end, t0 + (w + 1) * FAIRNESS_WINDOW_S)
        if hi > lo:
            windows[w][user] = windows[w].get(user, 0.0) + (hi - lo) * gpus


def _water_fill(
    demand: dict[str, float], weight: dict[str, float], capacity: float
) -> dict[str, float]:
    """Weighted max-min fair split of ``capacity``: nobody gets more than they asked for."""
    fair: dict[str, float] = {}
    active = sorted(demand, key=lambda u: demand[u] / weight[u])
    left = capacity
    total_weight = sum(weight[u] for u in active)
    for u in active:
        share = left * weight[u] / total_weight if total_weight > 0 else 0.0
        give = min(demand[u], share)
        fair[u] = give
        left -= give
        total_weight -= weight[u]
    return fair


def _percentile(values: Sequence[float], pct: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * pct / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)

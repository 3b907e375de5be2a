"""An open-loop (fixed-rate) load generator for `make bench`.

Closed-loop clients wait for each answer before they ask again, so a slow server slows
its own load and the figures look better than what members see at a deadline. Here the
arrivals are fixed in advance: a Poisson process at ``rate`` requests per second, each
request's page drawn at random. A request is sent at its arrival time whether or not the
earlier ones have been answered, and its latency counts from that arrival time (not from
when a free client thread took it), so a server that falls behind shows it in full.
"""

from __future__ import annotations

import math
import random
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

# A request: (page name) -> (HTTP status). Called from many threads at once.
Fetch = Callable[[str], int]


def arrivals(rate: float, seconds: float, seed: int = 1) -> list[float]:
    """Poisson arrival times (seconds from the start) at `rate` per second over `seconds`."""
    if rate <= 0 or seconds <= 0:
        raise ValueError("rate and seconds must be positive")
    rng = random.Random(seed)
    times, t = [], rng.expovariate(rate)
    while t < seconds:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def percentile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank percentile of an ordered sample (q in 0..1)."""
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))
    return ordered[rank]


def run(
    fetch: Fetch,
    pages: Sequence[str],
    *,
    rate: float,
    seconds: float,
    seed: int = 1,
    max_in_flight: int = 256,
) -> dict[str, Any]:
    """Send requests at fixed arrival times; latency per page from each arrival time.

    `max_in_flight` threads send; if all of them are busy, later arrivals wait for one and
    that wait is part of their latency (the server is that far behind)."""
    schedule = arrivals(rate, seconds, seed)
    rng = random.Random(seed + 1)
    names = list(pages)
    chosen = [rng.choice(names) for _ in schedule]
    latencies: dict[str, list[float]] = defaultdict(list)
    errors: list[str] = []
    lock = threading.Lock()
    started = time.perf_counter()
    lag = 0.0  # the dispatcher's worst lateness behind the schedule (the generator's own limit)

    def one(name: str, due: float) -> None:
        try:
            status = fetch(name)
        except Exception as exc:  # a refused or timed-out request is an error, not a latency
            status, reason = 0, f"{type(exc).__name__}: {exc}"
        else:
            reason = str(status)
        took = time.perf_counter() - started - due
        with lock:
            if status != 200:
                errors.append(f"{name}: {reason}")
            latencies[name].append(took)

    with ThreadPoolExecutor(max_workers=max_in_flight) as pool:
        for due, name in zip(schedule, chosen, strict=True):
            wait = due - (time.perf_counter() - started)
            if wait > 0:
                time.sleep(wait)
            else:
                lag = max(lag, -wait)
            pool.submit(one, name, due)
    elapsed = time.perf_counter() - started
    result: dict[str, Any] = {"pages": {}, "errors": errors}
    every: list[float] = []
    for name, values in sorted(latencies.items()):
        ordered = sorted(values)
        every += ordered
        result["pages"][name] = _summary(ordered)
    result["all"] = {
        **_summary(sorted(every)),
        "offered_per_s": rate,
        "sent_per_s": round(len(schedule) / seconds, 1),
        "answered_per_s": round(len(every) / elapsed, 1),
        "dispatch_lag_max_ms": round(lag * 1000, 1),
    }
    return result


def _summary(ordered: list[float]) -> dict[str, float]:
    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered) * 1000, 1) if ordered else float("nan"),
        "p95_ms": round(percentile(ordered, 0.95) * 1000, 1),
        "p99_ms": round(percentile(ordered, 0.99) * 1000, 1),
    }


def saturation(
    fetch: Fetch,
    pages: Sequence[str],
    *,
    rates: Sequence[float],
    seconds: float,
    limit_ms: float = 1000.0,
) -> dict[str, Any]:
    """Offer each rate in turn (rising) until the p95 over all pages passes `limit_ms`.

    Returns the highest rate whose p95 stayed under the limit, the first that did not
    (None if none did), and each step's p95."""
    steps = []
    best, first_over = None, None
    for rate in sorted(rates):
        outcome = run(fetch, pages, rate=rate, seconds=seconds, seed=int(rate))
        p95 = outcome["all"]["p95_ms"]
        steps.append({"rate": rate, "p95_ms": p95, "errors": len(outcome["errors"])})
        if p95 > limit_ms or outcome["errors"]:
            first_over = rate
            break
        best = rate
    return {"limit_ms": limit_ms, "held_per_s": best, "passed_at_per_s": first_over, "steps": steps}

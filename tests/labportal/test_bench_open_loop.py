"""The open-loop load generator of `make bench` (benchmarks.open_loop): arrivals at a fixed
rate, latency from each arrival (not from when the server was ready), errors kept apart,
and the saturation search. The fetches here are stand-ins for a server: a lock held for a
fixed service time makes one with a known capacity."""

from __future__ import annotations

import threading
import time

import pytest

from benchmarks import open_loop


def serial_server(service_s: float) -> open_loop.Fetch:
    """A server that answers one request at a time, each in `service_s`."""
    lock = threading.Lock()

    def fetch(name: str) -> int:
        with lock:
            time.sleep(service_s)
        return 200

    return fetch


def test_arrivals_are_a_poisson_process_at_the_rate_asked_for() -> None:
    times = open_loop.arrivals(50, 200, seed=3)
    assert times == sorted(times) and times[0] > 0 and times[-1] < 200
    assert 9_700 < len(times) < 10_300  # 10,000 expected; the standard deviation is 100
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    mean = sum(gaps) / len(gaps)
    # Exponential gaps: the standard deviation equals the mean (a fixed period would be 0).
    sd = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
    assert 0.9 < sd / mean < 1.1
    assert open_loop.arrivals(50, 200, seed=3) == times
    with pytest.raises(ValueError):
        open_loop.arrivals(0, 10)


def test_the_nearest_rank_percentile() -> None:
    ordered = [float(i) for i in range(1, 21)]
    assert open_loop.percentile(ordered, 0.95) == 19.0
    assert open_loop.percentile(ordered, 0.5) == 10.0
    assert open_loop.percentile(ordered, 1.0) == 20.0
    assert open_loop.percentile([7.0], 0.99) == 7.0


def test_a_server_that_falls_behind_shows_its_backlog_in_the_latency() -> None:
    # 40 requests/s offered to a server that answers 20/s: each answer takes 50 ms, but the
    # arrivals queue behind each other, so by the end they wait about a second.
    outcome = open_loop.run(serial_server(0.05), ["a", "b"], rate=40, seconds=2.0, seed=5)
    every = outcome["all"]
    assert outcome["errors"] == []
    assert every["n"] == len(open_loop.arrivals(40, 2.0, seed=5))
    assert set(outcome["pages"]) == {"a", "b"}
    assert every["p50_ms"] > 200 and every["p95_ms"] > 600
    assert every["answered_per_s"] < 30


def test_a_server_with_room_answers_near_its_service_time() -> None:
    outcome = open_loop.run(serial_server(0.01), ["a"], rate=10, seconds=2.0, seed=2)
    assert outcome["errors"] == []
    assert 10 <= outcome["all"]["p50_ms"] < 150


def test_refused_and_failed_requests_are_errors_not_latencies_alone() -> None:
    calls = iter(range(10_000))

    def fetch(name: str) -> int:
        n = next(calls)
        if n % 3 == 1:
            raise ConnectionError("refused")
        return 500 if n % 3 == 2 else 200

    outcome = open_loop.run(fetch, ["p"], rate=30, seconds=1.0, seed=1)
    sent = outcome["all"]["n"]
    assert len(outcome["errors"]) == sent - (sent + 2) // 3
    assert any("ConnectionError: refused" in e for e in outcome["errors"])
    assert any(e == "p: 500" for e in outcome["errors"])


def test_saturation_is_the_highest_rate_whose_p95_stays_under_the_limit() -> None:
    # Capacity 25 requests/s: 5 and 10/s hold; 200/s for half a second leaves a 4 s queue.
    found = open_loop.saturation(
        serial_server(0.04), ["a"], rates=[200, 5, 10], seconds=0.5, limit_ms=1000
    )
    assert found["held_per_s"] == 10 and found["passed_at_per_s"] == 200
    assert [step["rate"] for step in found["steps"]] == [5, 10, 200]
    assert found["steps"][-1]["p95_ms"] > 1000

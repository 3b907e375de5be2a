"""The forecast's search for one GPU against a plain reference (issue 15, pass speed).

``_Forecast._single`` sweeps a unit's bookings inline and stops a sweep once the start it
finds can no longer beat the best one so far. These tests hold it to the plain form it
replaced, which calls ``_valid_from`` for every unit it walks, over random clusters,
bookings, free times, earliest starts and run lengths.
"""

from __future__ import annotations

import bisect
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.engine import _Pass
from scheduler.forecast import INF, _Forecast
from scheduler.model import Reservation
from tests.scheduler.builders import HOUR, NOW, gpus_for, policy, running, state

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference_single(
    f: _Forecast, classes: tuple[int, ...], t_min: float, r: float, owner: int
) -> tuple[float, int] | None:
    """The search as it was before it was inlined: same walk, no early stop."""
    best_t = INF
    best_u = -1
    for c in classes:
        pool = f.pools.get(c)
        if not pool:
            continue
        i = bisect.bisect_right(pool, (t_min, INF)) - 1
        j = i
        found = False
        while j >= 0 and i - j < 8:
            u = pool[j][1]
            t = f._valid_from(u, t_min, r, owner)
            if t == t_min:
                if t_min < best_t:
                    best_t, best_u = t_min, u
                found = True
                break
            if t < best_t:
                best_t, best_u = t, u
            j -= 1
        if found:
            continue
        j = i + 1
        while j < len(pool):
            free, u = pool[j]
            if free >= best_t:
                break
            t = f._valid_from(u, free, r, owner)
            if t < best_t:
                best_t, best_u = t, u
            j += 1
    if best_u < 0:
        return None
    return best_t, best_u


def random_forecast(seed: int) -> _Forecast:
    rng = random.Random(seed)
    nodes, per_node = rng.randint(1, 4), rng.choice((2, 4, 8))
    gpus = gpus_for(nodes, per_node)
    ids = [g.id for g in gpus]
    busy = rng.sample(ids, rng.randint(0, len(ids)))
    run = tuple(
        running(
            100 + n,
            (gpu,),
            start_time=NOW - rng.uniform(0, 4 * HOUR),
            time_limit_s=rng.uniform(1, 8) * HOUR,
            predicted_runtime_s=rng.choice((None, rng.uniform(0.5, 6) * HOUR)),
        )
        for n, gpu in enumerate(busy)
    )
    bookings = []
    for n in range(rng.randint(0, 6)):
        start = NOW + rng.uniform(-HOUR, 10 * HOUR)
        bookings.append(
            Reservation(
                id=n + 1,
                user=rng.choice(("carol", "dave")),
                gpu_ids=tuple(rng.sample(ids, rng.randint(1, len(ids)))),
                start=start,
                end=start + rng.uniform(0.25, 6) * HOUR,
            )
        )
    p = _Pass(state(gpus, (), run, tuple(bookings)), policy(), NOW)
    f = _Forecast(p, [], {}, {}, set())
    # Jobs already placed by the forecast move units' free times on.
    for _ in range(rng.randint(0, 3 * len(ids))):
        u = rng.randrange(len(ids))
        f._book(u, f.free_at[u] + rng.uniform(0.1, 5) * HOUR)
    return f


@SETTINGS
@given(
    seed=st.integers(0, 10_000),
    lead=st.floats(0, 12 * HOUR),
    run_h=st.floats(0.01, 12),
    owner=st.sampled_from((-2, 1, 2)),
)
def test_single_gpu_search_equals_the_plain_walk(
    seed: int, lead: float, run_h: float, owner: int
) -> None:
    f = random_forecast(seed)
    classes = tuple(sorted(f.pools))
    t_min, r = NOW + lead, run_h * HOUR
    assert f._single(classes, t_min, r, owner) == reference_single(f, classes, t_min, r, owner)


def test_a_unit_booked_soon_is_passed_over_for_one_free_for_long_enough() -> None:
    # g0 frees first but is booked by someone else one hour from now; g1 frees later and
    # is never booked. A two-hour job fits only on g1; a half-hour job fits on g0 at once.
    gpus = gpus_for(1, 2)
    run = (
        running(10, ("n0-g0",), start_time=NOW - HOUR, time_limit_s=HOUR + 60),
        running(11, ("n0-g1",), start_time=NOW - HOUR, time_limit_s=HOUR + 600),
    )
    booking = Reservation(1, "carol", ("n0-g0",), NOW + HOUR, NOW + 5 * HOUR)
    f = _Forecast(_Pass(state(gpus, (), run, (booking,)), policy(), NOW), [], {}, {}, set())
    classes = tuple(sorted(f.pools))
    assert f._single(classes, NOW, 2 * HOUR, -2) == (NOW + 600, 1)
    assert f._single(classes, NOW, 0.5 * HOUR, -2) == (NOW + 60, 0)
    # The booking's owner may use its GPUs through it.
    assert f._single(classes, NOW, 2 * HOUR, 1) == (NOW + 60, 0)

"""Least attained service, short jobs first, and packing placement (issue 15)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.engine import plan
from scheduler.model import ClusterState, Gpu, Node, PendingJob, RunningJob, ShareNode
from scheduler.priority import Ranker, attained_factors, rank_pending, short_level
from scheduler.simulate.backlog import _Backlog
from scheduler.simulate.run import labportal_policy
from tests.scheduler.builders import HOUR, NOW, flat_tree, gpus_for, job, policy, running, state

DAY = 86_400.0
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def started(result: object) -> dict[int, tuple[str, ...]]:
    return {s.job_id: s.gpu_ids for s in result.starts}  # type: ignore[attr-defined]


def holding(user: str, count: int, first_id: int = 90, node: str = "n1") -> tuple[RunningJob, ...]:
    return tuple(running(first_id + i, (f"{node}-g{i}",), user=user) for i in range(count))


# ------------------------------------------------------- least attained service
def test_a_user_holding_many_gpus_goes_after_one_holding_none() -> None:
    # Equal fair share; heavy holds 4 GPUs (a threshold) and submitted first.
    gpus = gpus_for(2, 4)
    pending = (job(1, user="heavy"), job(2, user="light"))
    st_ = state(
        gpus,
        pending,
        holding("heavy", 4) + (running(80, ("n0-g0", "n0-g1", "n0-g2"), user="other"),),
        share_tree=flat_tree("heavy", "light", "other"),
    )
    assert started(plan(st_, policy(), NOW)) == {2: ("n0-g3",)}
    # Without the term, submit order decides (fair share and age are equal).
    assert started(plan(st_, policy(weight_attained=0.0), NOW)) == {1: ("n0-g3",)}


def test_attained_queues_are_discrete() -> None:
    # 1 and 3 GPUs held are both under the first threshold (4): same queue, same term.
    st_ = state(
        gpus_for(2, 4),
        (job(1, user="a", submit_time=NOW - 60), job(2, user="b", submit_time=NOW - 60)),
        holding("a", 3) + (running(95, ("n0-g0",), user="b"),),
    )
    factors = attained_factors(st_, policy(), NOW)
    assert factors == {"a": 1.0, "b": 1.0}
    result = plan(st_, policy(), NOW)
    assert result.priorities[1] == pytest.approx(result.priorities[2])


def test_attained_factor_falls_by_queue_as_gpus_held_grow() -> None:
    gpus = gpus_for(4, 8)
    p = policy()
    levels = []
    for held in (0, 3, 4, 8, 16, 24):
        run = tuple(running(100 + i, (f"n{i // 8}-g{i % 8}",), user="u") for i in range(held))
        levels.append(attained_factors(state(gpus, (), run), p, NOW).get("u", 1.0))
    assert levels == pytest.approx([1.0, 1.0, 2 / 3, 1 / 3, 0.0, 0.0])


def test_two_dimensional_attained_service_counts_gpu_seconds() -> None:
    p = policy(attained_2d=True, attained_thresholds=(4 * HOUR, 16 * HOUR))
    gpus = gpus_for(1, 8)
    # 2 GPUs for 1 hour (2 GPU-hours) vs 2 GPUs for 3 hours (6 GPU-hours).
    young = (running(1, ("n0-g0", "n0-g1"), user="y", start_time=NOW - HOUR),)
    old = (running(2, ("n0-g2", "n0-g3"), user="o", start_time=NOW - 3 * HOUR),)
    factors = attained_factors(state(gpus, (), young + old), p, NOW)
    assert factors == {"y": 1.0, "o": 0.5}


def test_attained_service_never_overrides_tiers() -> None:
    gpus = gpus_for(2, 4)
    pending = (job(1, user="heavy", queue="high"), job(2, user="light"))
    st_ = state(gpus, pending, holding("heavy", 4) + holding("x", 3, 95, "n0"))
    assert started(plan(st_, policy(), NOW)) == {1: ("n0-g3",)}


# ------------------------------------------------------------- short jobs first
def test_short_levels_are_log_spaced_by_time_limit() -> None:
    p = policy()
    levels = [
        short_level(job(1, time_limit_s=limit), p)
        for limit in (300, 600, 1200, HOUR, 4 * HOUR, DAY, 3 * DAY, 7 * DAY, 30 * DAY)
    ]
    assert levels == sorted(levels)
    assert levels[0] == levels[1] == 0
    assert levels[-1] == levels[-2] == p.short_levels
    assert short_level(job(1, time_limit_s=DAY), policy(weight_short=0.0)) == 0


def test_a_shorter_time_limit_goes_first() -> None:
    pending = (job(1, time_limit_s=3 * DAY), job(2, time_limit_s=HOUR))
    result = plan(state(gpus_for(1, 1), pending), policy(), NOW)
    assert started(result) == {2: ("n0-g0",)}
    off = plan(state(gpus_for(1, 1), pending), policy(weight_short=0.0), NOW)
    assert started(off) == {1: ("n0-g0",)}


def test_limits_of_one_level_keep_submit_order() -> None:
    p = policy()
    a, b = job(1, time_limit_s=2 * HOUR), job(2, time_limit_s=2 * HOUR + 60)
    assert short_level(a, p) == short_level(b, p)
    assert started(plan(state(gpus_for(1, 1), (a, b)), p, NOW)) == {1: ("n0-g0",)}


def test_a_long_job_ahead_keeps_its_backfill_guarantee_against_short_jobs() -> None:
    # The light user's 7-day job ranks first (fair share) and waits for the whole node
    # (free in 1 h); the heavy user's shorter jobs rank higher than they would without
    # the short-job term, yet only one that ends before that start may backfill.
    busy = (running(90, ("n0-g0", "n0-g1"), time_limit_s=2 * HOUR),)
    wide = job(1, user="light", gpus=4, time_limit_s=7 * DAY)
    four_hours = job(2, user="heavy", gpus=2, time_limit_s=4 * HOUR)
    half_hour = job(3, user="heavy", gpus=2, time_limit_s=0.5 * HOUR)
    st_ = state(
        gpus_for(1, 4),
        (wide, four_hours, half_hour),
        busy,
        share_tree=flat_tree("light", "heavy"),
        usage={"heavy": 1e9},
    )
    result = plan(st_, policy(drain_horizon_s=None), NOW)
    assert result.pending[1].position == 1
    assert result.guarantees[1].start == NOW + HOUR
    assert started(result) == {3: ("n0-g2", "n0-g3")}
    assert 2 in result.pending


# ------------------------------------------------------------------- packing
def test_a_small_job_fills_the_fullest_node_whatever_the_release_times() -> None:
    # n0: 1 GPU free, its jobs end in 1 h. n1: 3 free, its job ends in 30 h.
    # A 24-hour job extends n1's release less, but packing n0 keeps n1's 3 GPUs together.
    busy = tuple(running(90 + i, (f"n0-g{i}",), time_limit_s=2 * HOUR) for i in range(3)) + (
        running(95, ("n1-g0",), time_limit_s=31 * HOUR),
    )
    result = plan(state(gpus_for(2, 4), (job(1, time_limit_s=DAY),), busy), policy(), NOW)
    assert started(result) == {1: ("n0-g3",)}


def test_among_equally_full_nodes_the_least_release_extension_wins() -> None:
    busy = (
        running(90, ("n0-g0",), time_limit_s=2 * HOUR),
        running(91, ("n1-g0",), time_limit_s=31 * HOUR),
    )
    result = plan(state(gpus_for(2, 4), (job(1, time_limit_s=DAY),), busy), policy(), NOW)
    assert started(result)[1][0].startswith("n1-")


@st.composite
def partly_used(draw: st.DrawFn) -> tuple[ClusterState, int]:
    nodes = draw(st.integers(2, 5))
    gpus = gpus_for(nodes, 4)
    run: list[RunningJob] = []
    for n in range(nodes):
        for i in range(draw(st.integers(0, 4))):
            limit = draw(st.sampled_from([1, 2, 10, 30])) * HOUR
            run.append(running(100 + 10 * n + i, (f"n{n}-g{i}",), time_limit_s=limit))
    k = draw(st.integers(1, 3))
    limit = draw(st.sampled_from([1, 5, 24])) * HOUR
    return state(gpus, (job(1, gpus=k, time_limit_s=limit),), tuple(run)), k


@SETTINGS
@given(partly_used())
def test_a_job_goes_to_a_fitting_node_with_the_fewest_free_gpus(
    scenario: tuple[ClusterState, int],
) -> None:
    st_, k = scenario
    free: dict[str, int] = {}
    for g in st_.gpus:
        free[g.node] = free.get(g.node, 0) + 1
    for r in st_.running:
        for gid in r.gpu_ids:
            free[gid.split("-")[0]] -= 1
    partly = [f for f in free.values() if k <= f < 4]
    result = plan(st_, policy(drain_horizon_s=None), NOW)
    if not any(f >= k for f in free.values()):
        assert result.starts == []
        return
    node = result.starts[0].gpu_ids[0].split("-")[0]
    assert free[node] == (min(partly) if partly else 4)


# -------------------------------------------- the simulator's grouping still holds
@pytest.mark.parametrize("seed", range(4))
def test_the_backlog_prefix_matches_the_engines_order_with_both_new_terms(seed: int) -> None:
    rng = random.Random(seed)
    users = [f"u{i}" for i in range(5)]
    jobs: list[PendingJob] = []
    t = 0.0
    for i in range(250):
        t += rng.choice([0.0, 1.0, 50.0, 3000.0])
        jobs.append(
            PendingJob(
                i,
                rng.choice(users),
                "normal",
                t,
                gpus=rng.choice([1, 2, 4, 8]),
                time_limit_s=rng.choice([600.0, 1800.0, HOUR, 4 * HOUR, DAY, 3 * DAY, 9 * DAY]),
                category="phd",
            )
        )
    gpus = tuple(Gpu(f"n{n}-g{i}", f"n{n}", "A10", 24_000) for n in range(3) for i in range(8))
    held = [
        RunningJob(1000 + i, rng.choice(users), "normal", (g.id,), t - 100.0, DAY)
        for i, g in enumerate(gpus)
        if rng.random() < 0.6
    ]
    policy_ = labportal_policy()
    full = ClusterState(
        nodes=tuple(Node(f"n{n}") for n in range(3)),
        gpus=gpus,
        pending=tuple(jobs),
        running=tuple(held),
        share_tree=ShareNode("lab", 1.0, tuple(ShareNode(u, 1.0) for u in users)),
        usage={u: rng.uniform(0, 1e6) for u in users},
    )
    now = t + rng.uniform(0, 3 * DAY)
    expected = [r.job.id for r in rank_pending(full, policy_, now, {}, 8)]
    backlog = _Backlog(policy_)
    for j in jobs:
        backlog.add(j)
    ranker = Ranker(full, policy_, now, {}, 8)
    assert [j.id for j in backlog.prefix(ranker, len(jobs), ())] == expected

"""The drain reserve: long jobs may not stop every wide node from draining.

Wide nodes are the up nodes with the most whole GPUs. A node *drains* (within the
horizon, 3 days by default) when everything on it ends by its limit before then. A job
whose limit is longer than the horizon may not turn a draining wide node into a pinned
one if that leaves ``drain_reserve_nodes`` (1) or fewer draining wide nodes, or one
more than that for a job smaller than a wide node.
"""

from __future__ import annotations

from scheduler.engine import plan
from scheduler.model import Gpu, Reason
from tests.scheduler.builders import HOUR, NOW, gpus_for, job, policy, running, state

DAY = 24 * HOUR
LONG = 5 * DAY  # beyond the default 2-day horizon
SHORT = DAY


def started(result: object) -> dict[int, tuple[str, ...]]:
    return {s.job_id: s.gpu_ids for s in result.starts}  # type: ignore[attr-defined]


def long_running(first_id: int, node: str, count: int, user: str = "bob") -> tuple:
    """``count`` 1-GPU jobs on ``node`` that run, by their limit, 10 more days."""
    return tuple(
        running(first_id + i, (f"{node}-g{i}",), user=user, time_limit_s=10 * DAY + HOUR)
        for i in range(count)
    )


def test_a_long_narrow_job_must_leave_two_wide_nodes_draining() -> None:
    # n0 is full of long jobs; n1 and n2 drain. A long 1-GPU job would pin one of them
    # and leave a single draining node: it waits. A job within the horizon starts.
    busy = long_running(90, "n0", 4)
    pending = (job(1, time_limit_s=LONG), job(2, time_limit_s=SHORT))
    result = plan(state(gpus_for(3, 4), pending, busy), policy(), NOW)
    assert list(started(result)) == [2]
    assert result.pending[1].reason == Reason.RESOURCES
    # Its estimate is when n0, the node it may use, frees up, not "now".
    estimate = result.pending[1].estimated_start
    assert estimate is not None and estimate >= NOW + 9 * DAY


def test_long_narrow_jobs_gather_on_one_wide_node_then_wait() -> None:
    # Three idle wide nodes: long 1-GPU jobs may pin one of them (two stay draining).
    pending = tuple(job(i, time_limit_s=LONG) for i in range(1, 6))
    result = plan(state(gpus_for(3, 4), pending), policy(), NOW)
    assert sorted(started(result)) == [1, 2, 3, 4]
    assert len({g.split("-")[0] for gpus in started(result).values() for g in gpus}) == 1
    assert result.pending[5].reason == Reason.RESOURCES


def test_a_non_wide_node_takes_long_jobs_freely() -> None:
    gpus = gpus_for(3, 4) + tuple(Gpu(f"s-g{i}", "s", "A100", 40_000) for i in range(2))
    busy = long_running(90, "n0", 4)
    pending = (job(1, time_limit_s=LONG), job(2, time_limit_s=LONG), job(3, time_limit_s=LONG))
    result = plan(state(gpus, pending, busy), policy(), NOW)
    assert sorted(started(result)) == [1, 2]
    assert all(gpus[0].startswith("s-") for gpus in started(result).values())
    assert 3 in result.pending


def test_a_long_wide_job_may_take_one_of_two_draining_wide_nodes() -> None:
    busy = long_running(90, "n0", 4)
    result = plan(state(gpus_for(3, 4), (job(1, gpus=4, time_limit_s=LONG),), busy), policy(), NOW)
    assert list(started(result)) == [1]
    # With n1 pinned too, the last draining wide node is kept: the long job waits, a
    # 4-GPU job within the horizon still starts there.
    busy += long_running(95, "n1", 1)
    pending = (job(1, gpus=4, time_limit_s=LONG), job(2, gpus=4, time_limit_s=SHORT))
    result = plan(state(gpus_for(3, 4), pending, busy), policy(), NOW)
    assert list(started(result)) == [2]
    assert started(result)[2][0].startswith("n2-")
    assert result.pending[1].reason == Reason.RESOURCES


def test_a_guaranteed_long_job_keeps_the_draining_node_it_needs() -> None:
    # Four wide nodes: n0 pinned; n1 (A100) frees in 2 h; n2 and n3 (V100) are idle.
    # Job 1 (long, 4 A100) is guaranteed n1. Its node counts as pinned from then on, so
    # only one of the long V100 jobs behind it may pin a node: at job 1's start two wide
    # nodes (n1 and the other V100 node) still drain, as its reserve needs.
    gpus = (
        gpus_for(2, 4, "A100")
        + tuple(Gpu(f"n2-g{i}", "n2", "V100", 16_000) for i in range(4))
        + tuple(Gpu(f"n3-g{i}", "n3", "V100", 16_000) for i in range(4))
    )
    busy = long_running(90, "n0", 4) + (running(95, ("n1-g0",), time_limit_s=2 * HOUR + 60),)
    pending = (
        job(1, gpus=4, gpu_model="A100", time_limit_s=LONG),
        job(2, gpus=4, gpu_model="V100", time_limit_s=LONG),
        job(3, gpus=4, gpu_model="V100", time_limit_s=LONG),
    )
    result = plan(state(gpus, pending, busy), policy(), NOW)
    assert result.guarantees[1].gpu_ids[0].startswith("n1-")
    assert list(started(result)) == [2]
    assert 3 in result.pending


def test_the_reserve_is_off_without_two_wide_nodes_or_without_a_horizon() -> None:
    one_node = plan(state(gpus_for(1, 4), (job(1, time_limit_s=LONG),)), policy(), NOW)
    assert list(started(one_node)) == [1]
    busy = long_running(90, "n0", 4)
    pending = (job(1, time_limit_s=LONG),)
    off = plan(state(gpus_for(3, 4), pending, busy), policy(drain_horizon_s=None), NOW)
    assert list(started(off)) == [1]
    # A horizon longer than the job's limit makes it an ordinary job.
    longer = plan(state(gpus_for(3, 4), pending, busy), policy(drain_horizon_s=6 * DAY), NOW)
    assert list(started(longer)) == [1]


def test_emergency_jobs_are_exempt_from_the_drain_reserve() -> None:
    busy = long_running(90, "n0", 4)
    pending = (job(1, time_limit_s=LONG, emergency=True),)
    result = plan(state(gpus_for(3, 4), pending, busy), policy(), NOW)
    assert list(started(result)) == [1]

"""Job dependencies (Slurm's afterok / afterany) in the engine: a job whose
``depends_on`` is not empty never starts, waits with the reason ``dependency``, and is
estimated to start no earlier than the expected end of what it waits for.

The caller (the portal's pass) passes only the dependencies not yet satisfied: a chain
A -> B is B with ``depends_on=(A,)`` while A waits or runs, and B without it once A has
ended as its kind asks (completed for afterok; ended at all for afterany)."""

from __future__ import annotations

from scheduler.engine import plan
from scheduler.model import Reason
from tests.scheduler.builders import HOUR, NOW, gpus_for, job, policy, running, state


def test_b_does_not_start_while_a_waits_and_gets_the_reason() -> None:
    # Two free GPUs: A fits, and so would B, but B waits for A.
    a = job(1, gpus=1, time_limit_s=HOUR)
    b = job(2, gpus=1, time_limit_s=HOUR, depends_on=(1,))
    result = plan(state(gpus_for(1, 2), pending=(a, b)), policy(), NOW)
    assert [s.job_id for s in result.starts] == [1]
    assert result.pending[2].reason == Reason.DEPENDENCY
    assert 2 not in result.guarantees


def test_b_does_not_start_while_a_runs_and_is_estimated_after_a_ends() -> None:
    gpus = gpus_for(1, 2)
    a = running(1, (gpus[0].id,), user="alice", start_time=NOW, time_limit_s=2 * HOUR)
    b = job(2, gpus=1, time_limit_s=HOUR, depends_on=(1,))
    result = plan(state(gpus, pending=(b,), running_jobs=(a,)), policy(), NOW)
    assert result.starts == []
    info = result.pending[2]
    assert info.reason == Reason.DEPENDENCY
    # A free GPU is there now, but B's estimate is A's expected end (its limit here).
    assert info.estimated_start == NOW + 2 * HOUR


def test_b_starts_once_a_completed() -> None:
    # A completed: the pass no longer passes it as a dependency.
    b = job(2, gpus=1, time_limit_s=HOUR)
    result = plan(state(gpus_for(1, 2), pending=(b,)), policy(), NOW)
    assert [s.job_id for s in result.starts] == [2]


def test_afterany_after_a_failure_starts_like_any_job() -> None:
    # afterany: A's end, however it ended, satisfies B; the engine sees B without it.
    b = job(2, gpus=1, time_limit_s=HOUR, depends_on=())
    c = job(3, gpus=1, time_limit_s=HOUR, depends_on=(2,))
    result = plan(state(gpus_for(1, 2), pending=(b, c)), policy(), NOW)
    assert [s.job_id for s in result.starts] == [2]
    assert result.pending[3].reason == Reason.DEPENDENCY
    # C waits for B, started now for an hour (no prediction: its limit).
    assert result.pending[3].estimated_start == NOW + HOUR


def test_a_chain_is_estimated_end_to_end_even_when_the_last_job_ranks_first() -> None:
    # C is in the high queue (ranked first) but waits for B, which waits for A.
    gpus = gpus_for(1, 1)
    a = running(1, (gpus[0].id,), user="alice", start_time=NOW, time_limit_s=HOUR)
    b = job(2, gpus=1, time_limit_s=2 * HOUR, depends_on=(1,))
    c = job(3, queue="high", gpus=1, time_limit_s=HOUR, depends_on=(2,))
    result = plan(state(gpus, pending=(b, c), running_jobs=(a,)), policy(), NOW)
    assert result.pending[2].estimated_start == NOW + HOUR
    assert result.pending[3].estimated_start == NOW + 3 * HOUR
    assert {result.pending[2].reason, result.pending[3].reason} == {Reason.DEPENDENCY}


def test_a_dependency_the_engine_does_not_know_gives_no_estimate() -> None:
    b = job(2, gpus=1, time_limit_s=HOUR, depends_on=(99,))
    result = plan(state(gpus_for(1, 2), pending=(b,)), policy(), NOW)
    assert result.starts == []
    assert result.pending[2].reason == Reason.DEPENDENCY
    assert result.pending[2].estimated_start is None


def test_a_dependency_that_can_never_start_gives_no_estimate() -> None:
    a = job(1, gpus=64, time_limit_s=HOUR)  # more GPUs than any node has
    b = job(2, gpus=1, time_limit_s=HOUR, depends_on=(1,))
    result = plan(state(gpus_for(1, 2), pending=(a, b)), policy(), NOW)
    assert result.pending[1].reason == Reason.CONSTRAINTS
    assert result.pending[2].estimated_start is None


def test_a_circle_of_dependencies_starts_nothing_and_estimates_nothing() -> None:
    a = job(1, gpus=1, depends_on=(2,))
    b = job(2, gpus=1, depends_on=(1,))
    result = plan(state(gpus_for(1, 2), pending=(a, b)), policy(), NOW)
    assert result.starts == []
    assert result.pending[1].estimated_start is None
    assert result.pending[2].estimated_start is None


def test_a_waiting_dependent_leaves_its_gpus_to_the_next_job() -> None:
    # B (high queue, first in order) waits; C behind it takes the free GPU at once.
    gpus = gpus_for(1, 1)
    a = running(1, (), user="alice", start_time=NOW, time_limit_s=HOUR)
    b = job(2, queue="high", gpus=1, time_limit_s=HOUR, depends_on=(1,))
    c = job(3, gpus=1, time_limit_s=HOUR)
    result = plan(state(gpus, pending=(b, c), running_jobs=(a,)), policy(), NOW)
    assert [s.job_id for s in result.starts] == [3]
    assert result.pending[2].estimated_start is not None
    assert result.pending[2].estimated_start >= NOW + HOUR

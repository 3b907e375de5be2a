"""Property tests over random clusters and job mixes (hypothesis)."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.engine import limit_keys, plan
from scheduler.fairshare import fairshare_factors
from scheduler.model import (
    CategoryPolicy,
    ClusterState,
    Gpu,
    Node,
    NodeState,
    PendingJob,
    Plan,
    Policy,
    QueuePolicy,
    Reservation,
    RunningJob,
)
from scheduler.priority import rank_pending
from tests.scheduler.builders import HOUR, NOW, flat_tree

USERS = ("alice", "bob", "carol")
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[ClusterState, Policy]:
    gpus: list[Gpu] = []
    nodes: list[Node] = []
    for n in range(draw(st.integers(1, 3))):
        node_state = draw(
            st.sampled_from([NodeState.UP] * 4 + [NodeState.DRAINING, NodeState.DOWN])
        )
        nodes.append(Node(f"n{n}", node_state))
        model = draw(st.sampled_from(["A100", "V100"]))
        for i in range(draw(st.integers(2, 4))):
            gpus.append(Gpu(f"n{n}-g{i}", f"n{n}", model, 40_000 if model == "A100" else 16_000))
    ids = [g.id for g in gpus]

    reservations: list[Reservation] = []
    booked: set[str] = set()
    for r in range(draw(st.integers(0, 2))):
        chosen = draw(st.lists(st.sampled_from(ids), min_size=1, max_size=2, unique=True))
        if booked & set(chosen):
            continue
        booked |= set(chosen)
        start = NOW + draw(st.integers(-2, 3)) * HOUR
        length = draw(st.integers(1, 3)) * HOUR
        reservations.append(
            Reservation(r + 1, draw(st.sampled_from(USERS)), tuple(chosen), start, start + length)
        )

    running: list[RunningJob] = []
    free = list(ids)
    for j in range(draw(st.integers(0, 3))):
        if not free:
            break
        node = draw(st.sampled_from(sorted({g.split("-")[0] for g in free})))
        on_node = [g for g in free if g.startswith(node + "-")]
        take = on_node[: draw(st.integers(1, len(on_node)))]
        for g in take:
            free.remove(g)
        running.append(
            RunningJob(
                id=1000 + j,
                user=draw(st.sampled_from(USERS)),
                queue=draw(st.sampled_from(["normal", "high"])),
                gpu_ids=tuple(take),
                start_time=NOW - draw(st.integers(0, 4)) * HOUR,
                time_limit_s=draw(st.integers(1, 6)) * HOUR,
                predicted_runtime_s=draw(st.one_of(st.none(), st.just(HOUR))),
                preemptible=draw(st.booleans()),
                preemptions=draw(st.integers(0, 3)),
            )
        )

    pending: list[PendingJob] = []
    for j in range(draw(st.integers(0, 12))):
        user = draw(st.sampled_from(USERS))
        own = [r.id for r in reservations if r.user == user]
        pending.append(
            PendingJob(
                id=j + 1,
                user=user,
                queue=draw(st.sampled_from(["normal", "high", "debug"])),
                submit_time=NOW - draw(st.integers(0, 10)) * 60,
                gpus=draw(st.sampled_from([1, 1, 1, 2, 2, 3, 4])),
                gpu_model=draw(st.sampled_from([None, None, None, None, "A100", "V100"])),
                time_limit_s=draw(st.sampled_from([0.5, 1, 2, 4])) * HOUR,
                predicted_runtime_s=draw(st.one_of(st.none(), st.just(0.5 * HOUR))),
                reservation_id=draw(st.sampled_from([None, None, *own])) if own else None,
                emergency=draw(st.integers(0, 9)) == 0,
                preemptible=draw(st.integers(0, 3)) == 0,
                held=draw(st.integers(0, 9)) == 0,
                category="master" if user == "carol" else "phd",
            )
        )
    queues = {
        "high": QueuePolicy(
            "high", tier=0, max_running_jobs_per_user=draw(st.sampled_from([None, 1, 2]))
        ),
        "normal": QueuePolicy(
            "normal", tier=1, max_running_gpus_per_user=draw(st.sampled_from([None, 2, 4]))
        ),
        "debug": QueuePolicy("debug", tier=1, max_running_gpus=draw(st.sampled_from([None, 1, 3]))),
    }
    categories = {
        "master": CategoryPolicy("master", max_gpus_per_user=draw(st.sampled_from([None, 1, 2])))
    }
    policy = Policy(
        queues=queues,
        categories=categories,
        max_running_gpus_per_user=draw(st.sampled_from([None, 3, 6])),
        backfill_depth=draw(st.integers(1, 2)),
        # Short horizons so that the drain reserve applies to the drawn limits too.
        drain_horizon_s=draw(st.sampled_from([None, 3 * 86_400.0, 0.5 * HOUR, 2 * HOUR])),
        drain_reserve_nodes=draw(st.integers(1, 2)),
        preempt_starving_after_s=draw(st.sampled_from([None, 0.0, 5 * 60.0])),
        preempt_share_after_s=draw(st.sampled_from([None, 0.0, 5 * 60.0])),
        preempt_min_run_s=draw(st.sampled_from([0.0, 2 * HOUR])),
        preempt_max_times=draw(st.sampled_from([None, 0, 2])),
    )
    state = ClusterState(
        nodes=tuple(nodes),
        gpus=tuple(gpus),
        pending=tuple(pending),
        running=tuple(running),
        reservations=tuple(reservations),
        share_tree=flat_tree(*USERS),
        usage={"alice": draw(st.floats(0, 100)), "bob": 10.0},
        users_without_credit=frozenset(draw(st.sets(st.sampled_from(USERS), max_size=1))),
    )
    return state, policy


def _by_id(state: ClusterState) -> dict[int, PendingJob]:
    return {job.id: job for job in state.pending}


@SETTINGS
@given(scenarios())
def test_it_never_gives_a_gpu_twice(scenario: tuple[ClusterState, Policy]) -> None:
    state, policy = scenario
    result = plan(state, policy, NOW)
    taken = [g for job in state.running for g in job.gpu_ids]
    taken += [g for start in result.starts for g in start.gpu_ids]
    assert len(taken) == len(set(taken))
    gpus = {g.id: g for g in state.gpus}
    up = {n.name for n in state.nodes if n.state == NodeState.UP}
    jobs = _by_id(state)
    for start in result.starts:
        job = jobs[start.job_id]
        assert len(start.gpu_ids) == job.gpus
        assert len({gpus[g].node for g in start.gpu_ids}) == 1
        assert all(gpus[g].node in up for g in start.gpu_ids)
        assert all(job.gpu_model in (None, gpus[g].model) for g in start.gpu_ids)
        assert not job.held


@SETTINGS
@given(scenarios())
def test_no_job_starts_inside_someone_elses_reservation(
    scenario: tuple[ClusterState, Policy],
) -> None:
    state, policy = scenario
    result = plan(state, policy, NOW)
    jobs = _by_id(state)
    for start in result.starts:
        job = jobs[start.job_id]
        end = NOW + job.time_limit_s
        for reservation in state.reservations:
            if reservation.id == job.reservation_id:
                assert reservation.start <= NOW < reservation.end
                assert set(start.gpu_ids) <= set(reservation.gpu_ids)
                continue
            if set(start.gpu_ids) & set(reservation.gpu_ids):
                assert end <= reservation.start or reservation.end <= NOW


@SETTINGS
@given(scenarios())
def test_backfill_never_delays_the_guaranteed_start_of_the_first_blocked_job(
    scenario: tuple[ClusterState, Policy],
) -> None:
    state, policy = scenario
    policy = dataclasses.replace(policy, backfill_depth=1)
    first = plan(state, policy, NOW)
    if not first.guarantees or first.preemptions:
        return
    ((blocked_id, promise),) = first.guarantees.items()
    jobs = _by_id(state)
    blocked = jobs[blocked_id]
    per_node = [sum(1 for g in state.gpus if g.node == n.name) for n in state.nodes]
    reservations = {r.id: r for r in state.reservations}
    ranked = rank_pending(state, policy, NOW, reservations, max(per_node))
    order = [r.job.id for r in ranked]
    later = [s for s in first.starts if order.index(s.job_id) > order.index(blocked_id)]

    # Resources: nothing started behind it may still hold its GPUs at the promised start.
    for start in later:
        if set(start.gpu_ids) & set(promise.gpu_ids):
            assert NOW + jobs[start.job_id].time_limit_s <= promise.start

    # Limits: what still runs at the promised start leaves room for the blocked job.
    if not blocked.emergency and blocked.reservation_id is None:
        still_running: list[tuple[str, str, str, int]] = [
            (r.user, r.queue, r.category, len(r.gpu_ids)) for r in state.running
        ]
        still_running += [
            (jobs[s.job_id].user, jobs[s.job_id].queue, jobs[s.job_id].category, len(s.gpu_ids))
            for s in first.starts
            if s not in later or NOW + jobs[s.job_id].time_limit_s > promise.start
        ]
        for key, cap, per_unit, _ in limit_keys(
            policy, blocked.user, blocked.queue, blocked.category
        ):
            used = sum(
                (units if per_unit else 1)
                for user, queue, category, units in still_running
                if key in {k for k, *_ in limit_keys(policy, user, queue, category)}
            )
            backfilled = [
                s
                for s in later
                if key
                in {
                    k
                    for k, *_ in limit_keys(
                        policy, jobs[s.job_id].user, jobs[s.job_id].queue, jobs[s.job_id].category
                    )
                }
                and NOW + jobs[s.job_id].time_limit_s > promise.start
            ]
            if backfilled:
                assert used + (blocked.gpus if per_unit else 1) <= cap

    # And replanning right after applying the starts promises no later start.
    started = {s.job_id for s in first.starts}
    now_running = state.running + tuple(
        RunningJob(
            id=s.job_id,
            user=jobs[s.job_id].user,
            queue=jobs[s.job_id].queue,
            gpu_ids=s.gpu_ids,
            start_time=NOW,
            time_limit_s=jobs[s.job_id].time_limit_s,
            category=jobs[s.job_id].category,
            reservation_id=jobs[s.job_id].reservation_id,
            emergency=jobs[s.job_id].emergency,
        )
        for s in first.starts
    )
    after = dataclasses.replace(
        state,
        running=now_running,
        pending=tuple(j for j in state.pending if j.id not in started),
    )
    second = plan(after, policy, NOW)
    if blocked_id in second.guarantees:
        assert second.guarantees[blocked_id].start <= promise.start


@SETTINGS
@given(scenarios())
def test_limits_always_hold(scenario: tuple[ClusterState, Policy]) -> None:
    state, policy = scenario
    result = plan(state, policy, NOW)
    jobs = _by_id(state)
    user_queue_jobs: dict[tuple[str, str], int] = {}
    user_queue_units: dict[tuple[str, str], int] = {}
    queue_units: dict[str, int] = {}
    user_units: dict[str, int] = {}
    category_user_units: dict[tuple[str, str], int] = {}

    def count(user: str, queue: str, category: str, units: int) -> None:
        user_queue_jobs[(user, queue)] = user_queue_jobs.get((user, queue), 0) + 1
        user_queue_units[(user, queue)] = user_queue_units.get((user, queue), 0) + units
        queue_units[queue] = queue_units.get(queue, 0) + units
        user_units[user] = user_units.get(user, 0) + units
        key = (category, user)
        category_user_units[key] = category_user_units.get(key, 0) + units

    for running in state.running:
        count(running.user, running.queue, running.category, len(running.gpu_ids))
    for start in result.starts:
        job = jobs[start.job_id]
        count(job.user, job.queue, job.category, job.gpus)
        if job.emergency or job.reservation_id is not None:
            continue
        queue = policy.queues[job.queue]
        key = (job.user, job.queue)
        if queue.max_running_jobs_per_user is not None:
            assert user_queue_jobs[key] <= queue.max_running_jobs_per_user
        if queue.max_running_gpus_per_user is not None:
            assert user_queue_units[key] <= queue.max_running_gpus_per_user
        if queue.max_running_gpus is not None:
            assert queue_units[job.queue] <= queue.max_running_gpus
        if policy.max_running_gpus_per_user is not None:
            assert user_units[job.user] <= policy.max_running_gpus_per_user
        category = policy.categories.get(job.category)
        if category is not None and category.max_gpus_per_user is not None:
            assert category_user_units[(job.category, job.user)] <= category.max_gpus_per_user


@SETTINGS
@given(scenarios(), st.randoms(use_true_random=False))
def test_plans_are_deterministic_whatever_the_input_order(
    scenario: tuple[ClusterState, Policy], rng: object
) -> None:
    state, policy = scenario
    shuffled = dataclasses.replace(
        state,
        gpus=tuple(rng.sample(state.gpus, len(state.gpus))),  # type: ignore[attr-defined]
        pending=tuple(rng.sample(state.pending, len(state.pending))),  # type: ignore[attr-defined]
        running=tuple(rng.sample(state.running, len(state.running))),  # type: ignore[attr-defined]
    )
    first: Plan = plan(state, policy, NOW)
    assert plan(state, policy, NOW) == first
    assert plan(shuffled, policy, NOW) == first


@SETTINGS
@given(scenarios())
def test_it_preempts_only_preemptible_jobs_and_only_for_the_reasons_the_policy_allows(
    scenario: tuple[ClusterState, Policy],
) -> None:
    state, policy = scenario
    result = plan(state, policy, NOW)
    running = {job.id: job for job in state.running}
    jobs = _by_id(state)
    assert state.share_tree is not None
    factors = fairshare_factors(state.share_tree, state.usage)
    for preemption in result.preemptions:
        victim = running[preemption.job_id]
        assert victim.preemptible
        beneficiary = jobs[preemption.for_job_id]
        waited = NOW - beneficiary.submit_time
        if preemption.reason == "emergency":
            assert beneficiary.emergency
            continue
        if preemption.reason == "reservation":
            assert beneficiary.reservation_id is not None
            continue
        # A starving job or a member's share: never for a job marked preemptible, never a
        # job of the beneficiary's own owner, never one that has not run its minimum or
        # has been preempted as often as the policy allows.
        assert not beneficiary.preemptible
        assert victim.user != beneficiary.user
        assert NOW - victim.start_time >= policy.preempt_min_run_s
        cap = policy.preempt_max_times
        assert cap is None or victim.preemptions < cap
        if preemption.reason == "starving":
            assert policy.preempt_starving_after_s is not None
            assert waited >= policy.preempt_starving_after_s
        else:
            assert preemption.reason == "share"
            assert policy.preempt_share_after_s is not None
            assert waited >= policy.preempt_share_after_s
            assert factors[beneficiary.user] >= 0.5 > factors[victim.user]

"""One test per scheduling rule of DESIGN.md's "Scheduling policy"."""

from __future__ import annotations

import pytest

from scheduler.engine import plan
from scheduler.model import Gpu, GpuKind, NodeState, QueuePolicy, Reason
from tests.scheduler.builders import (
    HOUR,
    NOW,
    CategoryPolicy,
    Reservation,
    flat_tree,
    gpus_for,
    job,
    policy,
    running,
    slots_for,
    state,
)


def started(result: object) -> dict[int, tuple[str, ...]]:
    return {s.job_id: s.gpu_ids for s in result.starts}  # type: ignore[attr-defined]


# ---------------------------------------------------------------- placement
def test_it_starts_a_job_that_fits_on_an_idle_cluster() -> None:
    result = plan(state(pending=(job(1, gpus=2),)), policy(), NOW)
    assert list(started(result)) == [1]
    assert len(started(result)[1]) == 2
    assert result.pending == {}


def test_it_puts_all_gpus_of_a_job_on_one_node() -> None:
    # Three free GPUs on each node: a 4-GPU job must wait rather than span nodes.
    busy = (running(90, ("n0-g0",)), running(91, ("n1-g0",)))
    result = plan(state(pending=(job(1, gpus=4),), running_jobs=busy), policy(), NOW)
    assert result.starts == []
    assert result.pending[1].reason == Reason.RESOURCES
    gpus = (
        plan(state(pending=(job(1, gpus=3),), running_jobs=busy), policy(), NOW).starts[0].gpu_ids
    )
    assert len({g.split("-")[0] for g in gpus}) == 1


def test_it_fills_partly_used_nodes_first() -> None:
    busy = (running(90, ("n1-g0",)),)
    result = plan(state(pending=(job(1),), running_jobs=busy), policy(), NOW)
    assert started(result)[1][0].startswith("n1-")


def test_it_honours_the_gpu_model_and_memory_constraints() -> None:
    gpus = gpus_for(1, 2, "A100", 40_000) + tuple(
        Gpu(f"v-g{i}", "v", "V100", 16_000) for i in range(2)
    )
    pending = (job(1, gpu_model="V100"), job(2, min_memory_mb=30_000, gpus=2))
    result = plan(state(gpus, pending), policy(), NOW)
    assert started(result)[1][0].startswith("v-")
    assert all(g.startswith("n0-") for g in started(result)[2])


def test_it_reports_constraints_for_a_job_no_gpu_can_ever_hold() -> None:
    pending = (job(1, gpus=5), job(2, gpu_model="H100"), job(3, min_memory_mb=80_000))
    result = plan(state(pending=pending), policy(), NOW)
    for job_id in (1, 2, 3):
        assert result.pending[job_id].reason == Reason.CONSTRAINTS
        assert result.pending[job_id].estimated_start is None


def test_it_starts_nothing_on_draining_or_down_nodes() -> None:
    states = {"n0": NodeState.DRAINING, "n1": NodeState.DOWN}
    result = plan(state(pending=(job(1),), node_states=states), policy(), NOW)
    assert result.starts == []
    assert result.pending[1].reason == Reason.NODE_UNAVAILABLE
    result = plan(state(pending=(job(1),), node_states={"n0": NodeState.DRAINING}), policy(), NOW)
    assert started(result)[1][0].startswith("n1-")


def test_it_places_debug_jobs_on_shared_slots_packing_one_gpu_first() -> None:
    gpus = gpus_for(1, 1) + slots_for("n0", "sg0", 4) + slots_for("n0", "sg1", 4)
    busy = (running(90, ("sg1-s0",)),)
    pending = (job(1, queue="debug", shared_slot=True, time_limit_s=600),)
    result = plan(state(gpus, pending, busy), policy(), NOW)
    assert started(result)[1][0].startswith("sg1-")


def test_it_never_gives_a_slot_whose_physical_gpu_is_used_whole() -> None:
    gpus = (Gpu("g0", "n0", "A100", 40_000),) + slots_for("n0", "g0", 2)
    busy = (running(90, ("g0",)),)
    result = plan(state(gpus, (job(1, shared_slot=True),), busy), policy(), NOW)
    assert result.starts == []


def test_it_uses_mig_instances_only_for_single_unit_jobs_that_state_a_need() -> None:
    gpus = (Gpu("mig0", "n0", "A100-3g.20gb", 20_000, GpuKind.MIG, "g0"),) + gpus_for(1, 1)
    pending = (job(1, min_memory_mb=10_000), job(2))
    result = plan(state(gpus, pending), policy(), NOW)
    assert started(result) == {1: ("mig0",), 2: ("n0-g0",)}


# -------------------------------------------------------------------- order
def test_it_orders_emergency_then_reservation_window_then_queue_tier() -> None:
    gpus = gpus_for(1, 1)
    reservation = Reservation(7, "carol", ("n0-g0",), NOW - 10, NOW + HOUR)
    pending = (
        job(1, queue="high"),
        job(2, user="carol", reservation_id=7),
        job(3, emergency=True, user="dave"),
        job(4, queue="normal"),
    )
    result = plan(state(gpus, pending, reservations=(reservation,)), policy(), NOW)
    positions = {job_id: info.position for job_id, info in result.pending.items()}
    # The emergency job cannot use carol's booked GPU; carol's job can.
    assert started(result) == {2: ("n0-g0",)}
    assert positions[3] < positions[1] < positions[4]


def test_it_orders_by_fairshare_within_a_tier() -> None:
    gpus = gpus_for(1, 1)
    pending = (job(1, user="heavy"), job(2, user="light"))
    st = state(gpus, pending, share_tree=flat_tree("heavy", "light"), usage={"heavy": 100.0})
    assert started(plan(st, policy(), NOW)) == {2: ("n0-g0",)}


def test_it_runs_users_without_credit_after_users_with_credit_but_still_runs_them() -> None:
    st = state(
        gpus_for(1, 1),
        (job(1, user="broke", queue="normal"), job(2, user="rich")),
        share_tree=flat_tree("broke", "rich"),
        usage={"rich": 1000.0},
        users_without_credit=frozenset({"broke"}),
    )
    assert started(plan(st, policy(), NOW)) == {2: ("n0-g0",)}
    alone = state(
        gpus_for(1, 1), (job(1, user="broke"),), users_without_credit=frozenset({"broke"})
    )
    assert started(plan(alone, policy(), NOW)) == {1: ("n0-g0",)}


def test_it_breaks_priority_ties_by_submit_time_then_id() -> None:
    pending = (job(3, submit_time=NOW - 5), job(2, submit_time=NOW - 5), job(1, submit_time=NOW))
    result = plan(state(gpus_for(1, 1), pending), policy(), NOW)
    assert started(result) == {2: ("n0-g0",)}
    assert result.pending[3].position == 2
    assert result.pending[1].position == 3


def test_it_gives_age_a_weight_capped_at_max_age() -> None:
    old = job(1, submit_time=NOW - 30 * 86_400)
    older = job(2, submit_time=NOW - 60 * 86_400)
    result = plan(state(gpus_for(1, 1), (old, older)), policy(weight_fairshare=0), NOW)
    assert result.priorities[1] == pytest.approx(result.priorities[2])


# ------------------------------------------------------------------- limits
def test_it_enforces_each_users_running_job_limit_per_queue() -> None:
    queues = {"normal": QueuePolicy("normal", max_running_jobs_per_user=1)}
    result = plan(state(pending=(job(1), job(2), job(3, user="bob"))), policy(queues=queues), NOW)
    assert set(started(result)) == {1, 3}
    assert result.pending[2].reason == Reason.USER_LIMIT
    assert result.pending[2].estimated_start is not None


def test_it_counts_running_gpus_against_user_queue_and_category_limits() -> None:
    busy = (running(90, ("n0-g0", "n0-g1"), user="alice", category="master"),)
    queues = {"normal": QueuePolicy("normal", max_running_gpus=3)}
    categories = {"master": CategoryPolicy("master", max_gpus_per_user=2)}
    pending = (
        job(1, category="master"),
        job(2, user="bob", gpus=2),
        job(3, user="carol"),
    )
    result = plan(
        state(pending=pending, running_jobs=busy),
        policy(queues=queues, categories=categories),
        NOW,
    )
    assert result.pending[1].reason == Reason.CATEGORY_LIMIT
    assert result.pending[2].reason == Reason.QUEUE_LIMIT
    assert set(started(result)) == {3}


def test_it_enforces_the_global_gpus_per_user_limit() -> None:
    result = plan(
        state(pending=(job(1, gpus=2), job(2, gpus=2))), policy(max_running_gpus_per_user=3), NOW
    )
    assert set(started(result)) == {1}
    assert result.pending[2].reason == Reason.USER_LIMIT


def test_it_refuses_jobs_above_the_queues_max_gpus_per_job_or_wall_time() -> None:
    queues = {"normal": QueuePolicy("normal", max_gpus_per_job=2, max_wall_s=HOUR)}
    pending = (job(1, gpus=3), job(2, time_limit_s=2 * HOUR))
    result = plan(state(pending=pending), policy(queues=queues), NOW)
    assert result.starts == []
    assert {info.reason for info in result.pending.values()} == {Reason.QUEUE_LIMIT}
    assert all(info.estimated_start is None for info in result.pending.values())


def test_it_never_starts_a_held_job() -> None:
    result = plan(state(pending=(job(1, held=True),)), policy(), NOW)
    assert result.starts == []
    assert result.pending[1].reason == Reason.HELD


# ----------------------------------------------------------------- backfill
def test_it_backfills_a_short_job_that_ends_before_the_guaranteed_start() -> None:
    # n0: one GPU busy for another hour. Job 1 needs all four: guaranteed at NOW + 1h.
    busy = (running(90, ("n0-g0",), start_time=NOW - HOUR, time_limit_s=2 * HOUR),)
    gpus = gpus_for(1, 4)
    pending = (
        job(1, gpus=4, submit_time=NOW - 50),
        job(2, time_limit_s=HOUR / 2, submit_time=NOW - 40),
        job(3, time_limit_s=2 * HOUR, submit_time=NOW - 30),
    )
    result = plan(state(gpus, pending, busy), policy(), NOW)
    assert result.guarantees[1].start == NOW + HOUR
    assert set(started(result)) == {2}
    assert result.pending[3].reason == Reason.PRIORITY


def test_fifo_policy_starts_nothing_behind_the_first_blocked_job() -> None:
    busy = (running(90, ("n0-g0",)),)
    pending = (job(1, gpus=4, submit_time=NOW - 50), job(2, time_limit_s=60, submit_time=NOW - 40))
    result = plan(state(gpus_for(1, 4), pending, busy), policy(order="fifo", backfill=False), NOW)
    assert result.starts == []
    assert result.pending[2].reason == Reason.PRIORITY


# ------------------------------------------------------------- reservations
def test_it_never_starts_a_job_inside_another_users_reservation() -> None:
    gpus = gpus_for(1, 2)
    reservation = Reservation(1, "carol", ("n0-g0", "n0-g1"), NOW - HOUR, NOW + HOUR)
    result = plan(
        state(gpus, (job(1, time_limit_s=60),), reservations=(reservation,)), policy(), NOW
    )
    assert result.starts == []
    assert result.pending[1].reason == Reason.RESERVATION
    assert result.pending[1].estimated_start == NOW + HOUR


def test_it_does_not_start_a_job_whose_time_limit_runs_into_a_reservation() -> None:
    gpus = gpus_for(1, 1)
    reservation = Reservation(1, "carol", ("n0-g0",), NOW + HOUR, NOW + 2 * HOUR)
    pending = (job(1, time_limit_s=2 * HOUR), job(2, time_limit_s=HOUR / 2))
    result = plan(state(gpus, pending, reservations=(reservation,)), policy(), NOW)
    assert set(started(result)) == {2}
    estimate = result.pending[1].estimated_start
    assert estimate is not None and estimate >= NOW + 2 * HOUR


def test_it_runs_reservation_jobs_only_on_their_reservations_gpus() -> None:
    reservation = Reservation(1, "carol", ("n1-g3",), NOW - 60, NOW + HOUR)
    pending = (
        job(1, user="carol", reservation_id=1, gpus=1),
        job(2, user="carol", reservation_id=1),
    )
    result = plan(state(pending=pending, reservations=(reservation,)), policy(), NOW)
    assert started(result) == {1: ("n1-g3",)}
    assert result.pending[2].reason == Reason.RESOURCES


def test_it_keeps_reservation_jobs_pending_until_the_window_opens() -> None:
    reservation = Reservation(1, "carol", ("n0-g0",), NOW + HOUR, NOW + 3 * HOUR)
    result = plan(
        state(pending=(job(1, user="carol", reservation_id=1),), reservations=(reservation,)),
        policy(),
        NOW,
    )
    assert result.starts == []
    assert result.pending[1].reason == Reason.RESERVATION
    assert result.pending[1].estimated_start == NOW + HOUR


def test_it_refuses_a_job_that_names_someone_elses_reservation() -> None:
    reservation = Reservation(1, "carol", ("n0-g0",), NOW - 60, NOW + HOUR)
    result = plan(
        state(pending=(job(1, reservation_id=1),), reservations=(reservation,)), policy(), NOW
    )
    assert result.starts == []
    assert result.pending[1].estimated_start is None


# --------------------------------------------------------------- preemption
def test_it_preempts_only_preemptible_jobs_for_an_emergency() -> None:
    gpus = gpus_for(1, 2)
    busy = (running(90, ("n0-g0",), preemptible=True), running(91, ("n0-g1",)))
    result = plan(state(gpus, (job(1, emergency=True),), busy), policy(), NOW)
    assert [(p.job_id, p.reason, p.for_job_id) for p in result.preemptions] == [
        (90, "emergency", 1)
    ]
    assert result.pending[1].reason == Reason.PREEMPTING


def test_it_never_preempts_for_an_ordinary_job() -> None:
    gpus = gpus_for(1, 1)
    busy = (running(90, ("n0-g0",), preemptible=True),)
    result = plan(state(gpus, (job(1, queue="high"),), busy), policy(), NOW)
    assert result.preemptions == []


def test_it_preempts_preemptible_jobs_on_an_active_reservation_of_a_waiting_owner() -> None:
    gpus = gpus_for(1, 2)
    reservation = Reservation(5, "carol", ("n0-g0",), NOW - 60, NOW + HOUR)
    busy = (running(90, ("n0-g0",), preemptible=True), running(91, ("n0-g1",), preemptible=True))
    pending = (job(1, user="carol", reservation_id=5),)
    result = plan(state(gpus, pending, busy, (reservation,)), policy(), NOW)
    assert [p.job_id for p in result.preemptions] == [90]


def test_a_starving_job_requeues_another_members_preemptible_job() -> None:
    gpus = gpus_for(1, 2)
    busy = (
        running(90, ("n0-g0",), preemptible=True),
        running(91, ("n0-g1",), preemptible=True),
    )
    starving = job(1, gpus=2, submit_time=NOW - 13 * HOUR)
    rules = policy(preempt_starving_after_s=12 * HOUR)
    result = plan(state(gpus, (starving,), busy), rules, NOW)
    assert sorted((p.job_id, p.reason, p.for_job_id) for p in result.preemptions) == [
        (90, "starving", 1),
        (91, "starving", 1),
    ]
    assert result.pending[1].reason == Reason.PREEMPTING
    # Not yet starving, or the setting off: it waits.
    fresh = job(1, gpus=2, submit_time=NOW - 11 * HOUR)
    assert plan(state(gpus, (fresh,), busy), rules, NOW).preemptions == []
    assert plan(state(gpus, (starving,), busy), policy(), NOW).preemptions == []


def test_a_starving_job_stops_no_job_of_its_owner_none_that_just_started_none_not_preemptible() -> (
    None
):
    gpus = gpus_for(1, 3)
    busy = (
        running(90, ("n0-g0",), user="alice", preemptible=True),  # the starving job's owner's
        running(91, ("n0-g1",), preemptible=True, start_time=NOW - 60),  # ran one minute
        running(92, ("n0-g2",)),  # not marked preemptible
    )
    starving = job(1, submit_time=NOW - 13 * HOUR)
    rules = policy(preempt_starving_after_s=12 * HOUR, preempt_min_run_s=900.0)
    result = plan(state(gpus, (starving,), busy), rules, NOW)
    assert result.preemptions == []
    assert result.pending[1].reason == Reason.RESOURCES


def test_a_job_preempted_as_often_as_the_cap_allows_is_stopped_only_for_an_emergency() -> None:
    gpus = gpus_for(1, 2)
    busy = (
        running(90, ("n0-g0",), preemptible=True, preemptions=2),  # at the cap
        running(91, ("n0-g1",), preemptible=True, preemptions=1),
    )
    starving = job(1, submit_time=NOW - 13 * HOUR)
    rules = policy(preempt_starving_after_s=12 * HOUR, preempt_max_times=2)
    result = plan(state(gpus, (starving,), busy), rules, NOW)
    assert [(p.job_id, p.reason) for p in result.preemptions] == [(91, "starving")]
    # Both at the cap: the starving job waits; without a cap, either may be stopped.
    capped = (running(90, ("n0-g0",), preemptible=True, preemptions=2),)
    one = gpus_for(1, 1)
    assert plan(state(one, (starving,), capped), rules, NOW).preemptions == []
    assert plan(state(one, (starving,), capped), rules, NOW).pending[1].reason == Reason.RESOURCES
    uncapped = policy(preempt_starving_after_s=12 * HOUR, preempt_max_times=None)
    assert [p.job_id for p in plan(state(one, (starving,), capped), uncapped, NOW).preemptions] == [
        90
    ]
    # An emergency is not held back by the cap.
    emergency = job(2, emergency=True)
    assert [p.reason for p in plan(state(one, (emergency,), capped), rules, NOW).preemptions] == [
        "emergency"
    ]


def test_a_job_marked_preemptible_never_preempts_for_itself() -> None:
    gpus = gpus_for(1, 1)
    busy = (running(90, ("n0-g0",), preemptible=True),)
    starving = job(1, submit_time=NOW - 13 * HOUR, preemptible=True)
    rules = policy(preempt_starving_after_s=12 * HOUR, preempt_share_after_s=0.0)
    result = plan(state(gpus, (starving,), busy, share_tree=flat_tree("alice", "bob")), rules, NOW)
    assert result.preemptions == []


def test_a_member_under_their_share_requeues_a_preemptible_job_of_a_member_over_theirs() -> None:
    gpus = gpus_for(1, 2)
    busy = (
        running(90, ("n0-g0",), user="bob", preemptible=True),
        running(91, ("n0-g1",), user="carol", preemptible=True),
    )
    tree = flat_tree("alice", "bob", "carol")
    # bob has used most of the lab; carol about her third; alice nothing.
    usage = {"alice": 0.0, "bob": 80.0, "carol": 20.0}
    pending = (job(1, user="alice", submit_time=NOW - 20 * 60),)
    rules = policy(preempt_share_after_s=10 * 60)
    result = plan(state(gpus, pending, busy, share_tree=tree, usage=usage), rules, NOW)
    assert [(p.job_id, p.reason, p.for_job_id) for p in result.preemptions] == [(90, "share", 1)]
    # A member over their share does not preempt for it, and nor does one who waited less.
    over = (job(1, user="bob", submit_time=NOW - 20 * 60),)
    busy_carol = (running(91, ("n0-g0",), user="carol", preemptible=True),)
    assert (
        plan(
            state(gpus_for(1, 1), over, busy_carol, share_tree=tree, usage=usage), rules, NOW
        ).preemptions
        == []
    )
    early = (job(1, user="alice", submit_time=NOW - 5 * 60),)
    assert (
        plan(state(gpus, early, busy, share_tree=tree, usage=usage), rules, NOW).preemptions == []
    )


def test_the_share_reason_stops_only_members_over_their_share() -> None:
    gpus = gpus_for(1, 1)
    tree = flat_tree("alice", "bob", "carol")
    usage = {"alice": 0.0, "bob": 10.0, "carol": 90.0}  # bob under his share
    busy = (running(90, ("n0-g0",), user="bob", preemptible=True),)
    pending = (job(1, user="alice", submit_time=NOW - HOUR),)
    rules = policy(preempt_share_after_s=0.0)
    result = plan(state(gpus, pending, busy, share_tree=tree, usage=usage), rules, NOW)
    assert result.preemptions == []


def test_it_does_not_preempt_when_no_victim_is_preemptible() -> None:
    gpus = gpus_for(1, 1)
    busy = (running(90, ("n0-g0",)),)
    result = plan(state(gpus, (job(1, emergency=True),), busy), policy(), NOW)
    assert result.preemptions == []
    assert result.guarantees[1].start == NOW + HOUR


# ---------------------------------------------------------------- estimates
def test_it_estimates_starts_from_predicted_runtimes_capped_at_the_limit() -> None:
    gpus = gpus_for(1, 1)
    busy = (running(90, ("n0-g0",), start_time=NOW, time_limit_s=HOUR, predicted_runtime_s=600),)
    pending = (
        job(1, time_limit_s=HOUR, predicted_runtime_s=5 * HOUR),
        job(2, time_limit_s=HOUR),
    )
    result = plan(state(gpus, pending, busy), policy(), NOW)
    assert result.pending[1].estimated_start == NOW + 600
    assert result.pending[2].estimated_start == NOW + 600 + HOUR


def test_it_expects_a_job_past_its_prediction_to_run_on_for_a_while() -> None:
    # Predicted 1 h, running 2 h, limit 4 h: it ends "soon", but not in the 300 s a job
    # past its limit is given; short-horizon estimates were early by that much.
    gpus = gpus_for(1, 1)
    busy = (
        running(
            90,
            ("n0-g0",),
            start_time=NOW - 2 * HOUR,
            time_limit_s=4 * HOUR,
            predicted_runtime_s=HOUR,
        ),
    )
    pending = (job(1, time_limit_s=HOUR),)
    result = plan(state(gpus, pending, busy), policy(), NOW)
    assert result.pending[1].estimated_start == NOW + 600
    result = plan(state(gpus, pending, busy), policy(overrun_predicted_s=1800.0), NOW)
    assert result.pending[1].estimated_start == NOW + 1800


def test_a_job_past_its_limit_is_still_expected_to_stop_soon() -> None:
    gpus = gpus_for(1, 1)
    busy = (
        running(
            90,
            ("n0-g0",),
            start_time=NOW - 3 * HOUR,
            time_limit_s=2 * HOUR,
            predicted_runtime_s=HOUR,
        ),
    )
    result = plan(state(gpus, (job(1, time_limit_s=HOUR),), busy), policy(), NOW)
    assert result.pending[1].estimated_start == NOW + 300


def test_the_overrun_expected_of_a_prediction_changes_estimates_only() -> None:
    gpus = gpus_for(1, 4)
    busy = tuple(
        running(
            90 + i,
            (f"n0-g{i}",),
            start_time=NOW - 2 * HOUR,
            time_limit_s=(3 + i) * HOUR,
            predicted_runtime_s=HOUR,
        )
        for i in range(3)
    )
    pending = (job(1, gpus=2, time_limit_s=HOUR), job(2, time_limit_s=HOUR / 2))
    plans = [
        plan(state(gpus, pending, busy), policy(overrun_predicted_s=o), NOW) for o in (300, 3000)
    ]
    assert [started(p) for p in plans] == [{2: ("n0-g3",)}] * 2
    assert plans[0].guarantees == plans[1].guarantees
    assert plans[0].pending[1].estimated_start == NOW + 300
    assert plans[1].pending[1].estimated_start == NOW + 3000


def test_it_gives_every_pending_job_a_position_and_reason() -> None:
    pending = tuple(job(i, gpus=4) for i in range(1, 6))
    result = plan(state(pending=pending), policy(), NOW)
    assert len(result.starts) == 2
    assert sorted(info.position for info in result.pending.values()) == [3, 4, 5]
    assert all(info.estimated_start is not None for info in result.pending.values())


def test_it_returns_equal_plans_for_equal_inputs() -> None:
    pending = tuple(job(i, user=f"u{i % 3}", gpus=1 + i % 3) for i in range(20))
    st = state(pending=pending, share_tree=flat_tree("u0", "u1", "u2"), usage={"u0": 5.0})
    assert plan(st, policy(), NOW) == plan(st, policy(), NOW)


# ------------------------------------------------- category allowances per queue
def test_a_categorys_allowance_in_a_queue_overrides_the_queues_running_limits() -> None:
    # The article's "newcomers get more debug allowance": debug allows 1 running job
    # per member, the newcomers' category 3; the others keep the queue's 1.
    from scheduler.model import QueueAllowance

    queues = {**QUEUES_WITH_DEBUG_LIMIT}
    categories = {
        "newcomer": CategoryPolicy(
            "newcomer", queues={"debug": QueueAllowance(max_running_jobs_per_user=3)}
        ),
        "phd": CategoryPolicy("phd"),
    }
    pending = tuple(
        job(i, user="new", queue="debug", category="newcomer", time_limit_s=600)
        for i in (1, 2, 3, 4)
    ) + tuple(job(i, user="old", queue="debug", category="phd", time_limit_s=600) for i in (5, 6))
    result = plan(state(pending=pending), policy(queues=queues, categories=categories), NOW)
    assert set(started(result)) == {1, 2, 3, 5}
    assert result.pending[4].reason == Reason.USER_LIMIT
    assert result.pending[6].reason == Reason.USER_LIMIT


def test_a_categorys_gpu_allowance_can_be_tighter_than_the_queues() -> None:
    from scheduler.model import QueueAllowance

    categories = {
        "guest": CategoryPolicy(
            "guest", queues={"normal": QueueAllowance(max_running_gpus_per_user=1)}
        )
    }
    result = plan(
        state(pending=(job(1, gpus=2, category="guest"), job(2, category="guest"))),
        policy(categories=categories),
        NOW,
    )
    # A 2-GPU job can never run under a 1-GPU allowance; the 1-GPU job starts.
    assert set(started(result)) == {2}
    assert result.pending[1].reason == Reason.USER_LIMIT
    assert result.pending[1].estimated_start is None


QUEUES_WITH_DEBUG_LIMIT = {
    "normal": QueuePolicy("normal", tier=1, priority_factor=0.5),
    "debug": QueuePolicy(
        "debug", tier=1, priority_factor=0.5, max_wall_s=HOUR, max_running_jobs_per_user=1
    ),
}


# ------------------------------------------------------- why it waits, when
def test_zero_credit_is_the_reason_when_a_member_with_credit_waits_ahead() -> None:
    busy = (running(90, ("n0-g0",)),)
    st = state(
        gpus_for(1, 1),
        (job(1, user="broke"), job(2, user="rich")),
        running_jobs=busy,
        users_without_credit=frozenset({"broke"}),
    )
    result = plan(st, policy(), NOW)
    assert result.pending[1].reason == Reason.NO_CREDIT
    assert result.pending[2].reason == Reason.RESOURCES
    # Alone in the queue, zero credit keeps it from nothing: it waits for GPUs.
    alone = state(
        gpus_for(1, 1),
        (job(1, user="broke"),),
        running_jobs=busy,
        users_without_credit=frozenset({"broke"}),
    )
    assert plan(alone, policy(), NOW).pending[1].reason == Reason.RESOURCES

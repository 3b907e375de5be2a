"""What-if replays of the lab's own history through the scheduler simulator."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import pytest
from django.test import Client

from cluster.errors import SlotsRefused
from cluster.models import Gpu
from core.errors import NotAllowed
from jobqueue.models import Allocation, EmergencyRequest, Job, Queue, SchedulingPolicy
from reports.errors import BadReplay
from reports.models import PolicyChange, ReportTask
from reports.periods import period_of
from reports.replay import (
    BOOKING_QUEUE,
    EMERGENCY_QUEUE,
    PER_ADDED_NODE,
    ReplayOption,
    lab_cluster,
    lab_policy,
    replay_options,
    with_replay_queues,
    workload_from_history,
)
from reports.services import policy_apply_from_replay, report_task_create, report_task_run
from scheduler import model as sm
from tests.reports.conftest import MONDAY, at, book, make_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def busy_week(week: Any, alice: Any, bob: Any, charlie: Any) -> Any:
    """60 more jobs of 1-2 GPUs over the week, recorded as the replay itself ran them."""
    # A job spanning two nodes could never start in the simulator (a job runs on one node).
    Job.objects.filter(gpus=4).delete()
    rng = random.Random(7)
    gpus = list(Gpu.objects.order_by("uuid"))
    users = [alice, bob, charlie]
    for i in range(60):
        submitted = MONDAY + dt.timedelta(hours=i + rng.random())
        hours = rng.uniform(1, 6)
        make_job(
            users[i % 3],
            "normal",
            gpus[: rng.choice((1, 1, 2))],
            submitted,
            submitted,
            submitted + dt.timedelta(hours=hours),
            "completed",
        )
    # Write the lab's own scheduling of these jobs back as the recorded history.
    period = week["period"]
    simulated = _simulated_starts(period)
    for job in Job.objects.filter(submitted_at__gte=period.start).order_by("submitted_at", "id"):
        start = simulated[job.pk]
        assert job.ended_at is not None and job.started_at is not None
        runtime = job.ended_at - job.started_at
        Job.objects.filter(pk=job.pk).update(started_at=start, ended_at=start + runtime)
    return period


def _replayed_jobs(period: Any, **changes: float) -> list[Any]:
    """The period's jobs (not the bookings' blocks) as the simulator ran them, in order,
    on the lab's GPUs under the lab's policy with `changes`."""
    from scheduler.simulate.run import Simulation

    workload, _recorded = workload_from_history(period)
    sim = Simulation(
        workload,
        "labportal",
        gpus=4,
        per_node=PER_ADDED_NODE,
        slot_gpus=0,
        slots_per_gpu=4,
        timeslot_s=14400.0,
        cluster=lab_cluster(),
        policy=with_replay_queues(lab_policy(changes)),
    )
    sim.run()
    return [j for j in sim.jobs if j.queue != BOOKING_QUEUE]


def _simulated_starts(period: Any) -> dict[int, dt.datetime]:
    jobs = _replayed_jobs(period)
    ids = list(
        Job.objects.filter(
            submitted_at__gte=period.start, submitted_at__lt=period.end, ended_at__isnull=False
        )
        .order_by("submitted_at", "id")
        .values_list("id", flat=True)
    )
    return {
        pk: dt.datetime.fromtimestamp(j.start, tz=dt.UTC)
        for pk, j in zip(ids, jobs, strict=True)
        if j.start is not None
    }


def test_the_same_gpus_and_policy_reproduce_the_recorded_waits(busy_week: Any) -> None:
    recorded, same = replay_options(period=busy_week, options=[ReplayOption("same")])
    assert recorded.jobs == same.jobs == 63
    assert same.unfinished == 0
    assert recorded.wait_mean_h is not None and same.wait_mean_h is not None
    assert recorded.wait_mean_h > 0.5  # the week was busy enough to wait
    assert same.wait_mean_h == pytest.approx(recorded.wait_mean_h, rel=0.05)
    assert same.allocation_pct == pytest.approx(recorded.allocation_pct, rel=0.05)


def test_more_gpus_never_raise_the_mean_wait_and_fewer_never_lower_it(busy_week: Any) -> None:
    options = [ReplayOption(f"{d:+d}", gpu_delta=d, gpu_model="L40S") for d in (-1, 0, 2, 4, 8)]
    progress: list[tuple[int, int]] = []
    outcomes = replay_options(
        period=busy_week, options=options, progress=lambda d, t: progress.append((d, t))
    )
    assert progress == [(i, 5) for i in range(1, 6)]
    waits = [o.wait_mean_h or 0.0 for o in outcomes[1:]]
    assert waits == sorted(waits, reverse=True)
    assert waits[0] > waits[1] > waits[-1]
    assert [o.gpus for o in outcomes[1:]] == [3, 4, 6, 8, 12]
    assert outcomes[-1].unmet_gpu_hours <= outcomes[2].unmet_gpu_hours


def test_options_replayed_side_by_side_in_processes_give_the_same_outcomes(
    busy_week: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reports import replay

    options = [ReplayOption(f"{d:+d}", gpu_delta=d, gpu_model="L40S") for d in (0, 2, 4)]
    monkeypatch.setenv("LABPORTAL_REPLAY_PROCESSES", "1")
    serial_timings: dict[str, float] = {}
    serial = replay_options(period=busy_week, options=options, timings=serial_timings)
    monkeypatch.setattr(replay, "PARALLEL_MIN_JOBS", 1)  # the busy week is small
    monkeypatch.setenv("LABPORTAL_REPLAY_PROCESSES", "2")
    progress: list[tuple[int, int]] = []
    timings: dict[str, float] = {}
    parallel = replay_options(
        period=busy_week,
        options=options,
        progress=lambda d, t: progress.append((d, t)),
        timings=timings,
    )
    assert serial_timings["processes"] == 1 and timings["processes"] == 2
    assert progress == [(1, 3), (2, 3), (3, 3)]
    assert [o.as_dict() for o in parallel] == [o.as_dict() for o in serial]
    assert [o.label for o in parallel[1:]] == ["+0", "+2", "+4"]


def test_impossible_options_are_refused_with_a_reason(week: Any) -> None:
    period = week["period"]
    with pytest.raises(BadReplay, match="no GPU of model"):
        replay_options(period=period, options=[ReplayOption("x", gpu_delta=2, gpu_model="H100")])
    with pytest.raises(BadReplay, match="only 2 whole GPUs"):
        replay_options(period=period, options=[ReplayOption("x", gpu_delta=-3, gpu_model="A100")])
    empty = period_of("custom", dt.date(2025, 1, 1), dt.date(2025, 1, 31))
    with pytest.raises(BadReplay, match="No job of this period"):
        replay_options(period=empty, options=[ReplayOption("x")])


def test_a_replayed_policy_is_applied_in_one_step_and_audited(
    week: Any, admin_user: Any, bob: Any
) -> None:
    task = report_task_create(
        kind="replay",
        requester=admin_user,
        period=week["period"],
        options=[
            {"label": "today"},
            {"label": "age first", "policy_changes": {"weight_age": 5000}},
        ],
    )
    report_task_run(task_id=task.pk)
    task.refresh_from_db()
    assert task.state == ReportTask.State.DONE, task.error
    assert len(task.result["outcomes"]) == 3  # recorded, then the two options
    with pytest.raises(NotAllowed):
        policy_apply_from_replay(task=task, option_index=1, actor=bob)
    with pytest.raises(BadReplay, match="nothing to apply"):
        policy_apply_from_replay(task=task, option_index=0, actor=admin_user)
    before = SchedulingPolicy.current().weight_age
    change = policy_apply_from_replay(task=task, option_index=1, actor=admin_user)
    assert SchedulingPolicy.current().weight_age == 5000
    assert change.before == {"weight_age": before} and change.after == {"weight_age": 5000.0}
    assert change.predicted["label"] == "age first"
    assert PolicyChange.objects.get().changed_by == admin_user


def test_members_cannot_run_replays_and_bad_options_are_refused(
    week: Any, admin_user: Any, bob: Any
) -> None:
    with pytest.raises(NotAllowed):
        report_task_create(kind="replay", requester=bob, period=week["period"], options=[{}])
    for options, words in (
        ([], "between 1 and"),
        ([{"gpu_delta": "four"}], "whole number"),
        ([{"policy_changes": {"drain": 1}}], "not a setting"),
        ([{"policy_changes": {"weight_age": "high"}}], "numbers"),
    ):
        with pytest.raises(BadReplay, match=words):
            report_task_create(
                kind="replay", requester=admin_user, period=week["period"], options=options
            )


def _sim_waits(period: Any, **changes: float) -> dict[tuple[str, float], float]:
    """Each replayed job's wait (user, submit → hours) under the lab's policy with `changes`."""
    return {
        (j.user, j.submit): (j.start - j.submit) / 3600
        for j in _replayed_jobs(period, **changes)
        if j.start is not None
    }


def test_queue_limits_and_the_drain_reserve_map_onto_the_engine_policy(week: Any) -> None:
    policy = lab_policy(
        {
            "queue:normal:max_running_gpus_per_user": 1.0,
            "queue:debug:max_running_jobs_per_user": 0,
            "queue:normal:max_time_limit_s": 7200,
            "drain_reserve_nodes": 0,
        }
    )
    assert policy.queues["normal"].max_running_gpus_per_user == 1
    assert policy.queues["normal"].max_wall_s == 7200
    assert policy.queues["debug"].max_running_jobs_per_user is None  # 0: no limit
    assert policy.drain_reserve_nodes == 0
    bad: list[tuple[dict[str, float], str]] = [
        ({"queue:nope:max_gpus_per_job": 2}, "not a setting"),
        ({"queue:normal:max_gpus": 2}, "not a setting"),
        ({"queue:normal:max_gpus_per_job": 0}, "between 1 and 64"),
        ({"drain_reserve_nodes": 1.5}, "whole number"),
    ]
    for changes, words in bad:
        with pytest.raises(BadReplay, match=words):
            lab_policy(changes)


def test_a_tighter_queue_limit_makes_the_replayed_jobs_wait_longer(busy_week: Any) -> None:
    outcomes = replay_options(
        period=busy_week,
        options=[
            ReplayOption("today"),
            ReplayOption(
                "2 GPUs each", policy_changes={"queue:normal:max_running_gpus_per_user": 2}
            ),
        ],
    )
    today, limited = outcomes[1], outcomes[2]
    assert limited.unfinished == 0
    assert limited.wait_mean_h is not None and today.wait_mean_h is not None
    assert limited.wait_mean_h > today.wait_mean_h


def test_debug_gpus_split_whole_gpus_into_shared_slots_in_the_replayed_cluster(week: Any) -> None:
    _nodes, units = lab_cluster(debug_gpus=1)
    slots = [u for u in units if u.kind == sm.GpuKind.SLOT]
    assert len(slots) == 4 and {u.parent for u in slots} == {"GPU-l1"}  # the last GPU
    assert len({u.parent or u.id for u in units}) == 4  # the same GPUs, one of them shared
    with pytest.raises(BadReplay, match="Only 4 more"):
        lab_cluster(debug_gpus=5)


def test_a_booking_blocks_its_gpus_and_jobs_wait_longer_around_it(
    busy_week: Any, alice: Any
) -> None:
    (before,) = replay_options(period=busy_week, options=[ReplayOption("x")])[1:]
    # All four GPUs booked for Wednesday morning (two blocks: one per node).
    book(alice, list(Gpu.objects.filter(kind=Gpu.Kind.WHOLE)), at(2, 0), at(2, 12))
    workload, recorded = workload_from_history(busy_week)
    blocks = [
        j for j in workload.jobs if j.queue == BOOKING_QUEUE and j.submit >= at(2, 0).timestamp()
    ]
    # Then the conftest's: alice's released at 12:00 (2 h of 2 GPUs), bob's no-show
    # (its whole 2 h), the maintenance window (4 h); charlie's cancelled one is not in.
    assert [(j.gpus, j.duration / 3600) for j in blocks] == [
        (2, 12),
        (2, 12),
        (2, 2),
        (1, 2),
        (2, 4),
    ]
    recorded_out, after = replay_options(period=busy_week, options=[ReplayOption("x")])
    assert after.jobs == before.jobs == 63  # blocks are not jobs
    assert after.wait_mean_h is not None and before.wait_mean_h is not None
    assert after.wait_mean_h > before.wait_mean_h
    assert after.allocation_pct is not None and before.allocation_pct is not None
    assert after.allocation_pct > before.allocation_pct  # booked GPUs count as held


def test_jobs_that_ran_inside_a_booking_are_its_use_not_replayed_again(
    week: Any, alice: Any
) -> None:
    j1 = week["jobs"][0]
    booking = book(alice, list(Gpu.objects.filter(model="A100")), at(0, 2), at(0, 12))
    Job.objects.filter(pk=j1.pk).update(reservation=booking)
    workload, _recorded = workload_from_history(week["period"])
    alice_jobs = [(j.queue, j.gpus) for j in workload.jobs if j.user == "alice"]
    # J1 is folded into the new booking's block; alice's 4-GPU job J4 is still replayed;
    # the conftest's booking and maintenance window are blocks too.
    assert sorted(alice_jobs) == sorted([(BOOKING_QUEUE, 2)] * 3 + [("normal", 4)])


def test_an_emergency_job_is_replayed_first_and_waits_no_longer(
    busy_week: Any, admin_user: Any
) -> None:
    recorded_waits = _sim_waits(busy_week)
    (user, submit), wait = max(recorded_waits.items(), key=lambda kv: kv[1])
    assert wait > 0
    job = Job.objects.get(
        owner__username=user, submitted_at=dt.datetime.fromtimestamp(submit, tz=dt.UTC)
    )
    request = EmergencyRequest.objects.create(
        user=job.owner,
        reason="deadline",
        state=EmergencyRequest.State.EXPIRED,
        decided_by=admin_user,
        decided_at=job.submitted_at,
    )
    request.jobs.add(job)
    workload, _recorded = workload_from_history(busy_week)
    assert [j.queue for j in workload.jobs if j.queue == EMERGENCY_QUEUE] == [EMERGENCY_QUEUE]
    assert _sim_waits(busy_week)[(user, submit)] < wait


def test_queue_limits_drain_reserve_and_debug_gpus_are_applied_in_one_step_and_audited(
    week: Any, admin_user: Any
) -> None:
    changes = {
        "queue:normal:max_running_gpus_per_user": 2,
        "drain_reserve_nodes": 0,
        "debug_gpus": 1,
    }
    task = report_task_create(
        kind="replay",
        requester=admin_user,
        period=week["period"],
        options=[{"label": "tighter", "policy_changes": changes}],
    )
    report_task_run(task_id=task.pk)
    task.refresh_from_db()
    assert task.state == ReportTask.State.DONE, task.error
    change = policy_apply_from_replay(task=task, option_index=0, actor=admin_user)
    assert Queue.objects.get(name="normal").max_running_gpus_per_user == 2
    assert SchedulingPolicy.current().drain_reserve_nodes == 0
    shared = Gpu.objects.get(uuid="GPU-l1")
    assert shared.shared_slots == 4
    assert Gpu.objects.filter(parent=shared, kind="slot").count() == 4
    assert change.before == {
        "queue:normal:max_running_gpus_per_user": None,
        "drain_reserve_nodes": 1,
        "debug_gpus": 0,
    }
    assert change.after == changes
    assert change.predicted["label"] == "tighter"
    # The audit log in the admin shows the change and refuses edits.
    client = Client()
    client.force_login(admin_user)
    log = client.get("/admin/reports/policychange/")
    assert log.status_code == 200 and "max_running_gpus_per_user" in log.content.decode()
    detail = client.post(f"/admin/reports/policychange/{change.pk}/change/", {"after": "{}"})
    assert detail.status_code == 403 or PolicyChange.objects.get().after == changes


def test_a_refused_part_of_a_policy_change_leaves_everything_as_it_was(
    week: Any, admin_user: Any
) -> None:
    task = report_task_create(
        kind="replay",
        requester=admin_user,
        period=week["period"],
        options=[{"label": "x", "policy_changes": {"weight_age": 7, "debug_gpus": 1}}],
    )
    report_task_run(task_id=task.pk)
    task.refresh_from_db()
    gpu = Gpu.objects.get(uuid="GPU-l1")
    running = make_job(
        week["jobs"][0].owner, "normal", [gpu], at(6, 0), at(6, 0), at(6, 1), "running"
    )
    Allocation.objects.filter(job=running).update(active=True, released_at=None)
    before = SchedulingPolicy.current().weight_age
    with pytest.raises(SlotsRefused, match="in use"):
        policy_apply_from_replay(task=task, option_index=0, actor=admin_user)
    assert SchedulingPolicy.current().weight_age == before
    assert not PolicyChange.objects.exists()


def test_least_attained_service_and_short_jobs_weights_map_onto_the_engine_policy(
    week: Any,
) -> None:
    today = lab_policy()
    assert (today.weight_attained, today.weight_short) == (3000.0, 5000.0)
    assert today.attained_thresholds == (4.0, 8.0, 16.0)
    policy = lab_policy({"weight_attained": 0, "weight_short": 9000, "attained_first_threshold": 2})
    assert (policy.weight_attained, policy.weight_short) == (0.0, 9000.0)
    assert policy.attained_thresholds == (2.0, 4.0, 8.0)  # the ratios kept
    SchedulingPolicy.objects.filter(pk=SchedulingPolicy.current().pk).update(
        attained_thresholds="4, 8, 1000"
    )
    bad: list[tuple[dict[str, float], str]] = [
        ({"weight_short": -1}, "between 0 and 1e"),
        ({"weight_attained": 2e6}, "between 0 and 1e"),
        ({"attained_first_threshold": 0}, "between 1 and 10000"),
        ({"attained_first_threshold": 500}, "at most 100000"),  # 1000 scales to 125000
    ]
    for changes, words in bad:
        with pytest.raises(BadReplay, match=words):
            lab_policy(changes)


def test_a_higher_short_jobs_weight_makes_the_replayed_short_jobs_wait_less(
    busy_week: Any,
) -> None:
    ids = list(
        Job.objects.filter(submitted_at__gte=busy_week.start)
        .order_by("submitted_at", "id")
        .values_list("id", flat=True)
    )
    Job.objects.filter(pk__in=ids[::2]).update(time_limit_s=12 * 3600)

    def short_waits(**changes: float) -> dict[tuple[str, float], float]:
        jobs = _replayed_jobs(busy_week, **changes)
        return {
            (j.user, j.submit): j.start - j.submit
            for j in jobs
            if j.time_limit < 86400 and j.start is not None
        }

    first, last = short_waits(weight_short=1e6), short_waits(weight_short=0)
    both = first.keys() & last.keys()
    assert len(both) > 20
    assert sum(first[k] for k in both) < sum(last[k] for k in both)


def test_replayed_attained_service_and_short_jobs_settings_are_applied_and_audited(
    week: Any, admin_user: Any
) -> None:
    changes = {"weight_short": 0, "weight_attained": 6000, "attained_first_threshold": 2}
    task = report_task_create(
        kind="replay",
        requester=admin_user,
        period=week["period"],
        options=[{"label": "by GPUs held", "policy_changes": changes}],
    )
    report_task_run(task_id=task.pk)
    task.refresh_from_db()
    assert task.state == ReportTask.State.DONE, task.error
    change = policy_apply_from_replay(task=task, option_index=0, actor=admin_user)
    policy = SchedulingPolicy.current()
    assert (policy.weight_short, policy.weight_attained) == (0.0, 6000.0)
    assert policy.attained_thresholds == "2, 4, 8"
    assert change.before == {
        "weight_short": 5000.0,
        "weight_attained": 3000.0,
        "attained_thresholds": "4, 8, 16",
    }
    assert change.after == {
        "weight_short": 0.0,
        "weight_attained": 6000.0,
        "attained_thresholds": "2, 4, 8",
    }
    assert change.predicted["label"] == "by GPUs held"
    for bad, words in (
        ({"weight_short": -5}, "between 0 and"),
        ({"attained_first_threshold": 0.5}, "between 1 and 10000"),
        ({"attained_thresholds": 4}, "not a setting"),
    ):
        with pytest.raises(BadReplay, match=words):
            report_task_create(
                kind="replay",
                requester=admin_user,
                period=week["period"],
                options=[{"policy_changes": bad}],
            )

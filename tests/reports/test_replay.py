"""What-if replays of the lab's own history through the scheduler simulator."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import pytest

from cluster.models import Gpu
from jobqueue.models import Job, SchedulingPolicy
from labportal.errors import NotAllowed
from reports.errors import BadReplay
from reports.models import PolicyChange, ReportTask
from reports.periods import period_of
from reports.replay import ReplayOption, replay_options
from reports.services import policy_apply_from_replay, report_task_create, report_task_run
from tests.reports.conftest import MONDAY, make_job

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


def _simulated_starts(period: Any) -> dict[int, dt.datetime]:
    from reports.replay import (
        BOOKING_QUEUE,
        PER_ADDED_NODE,
        lab_cluster,
        lab_policy,
        with_replay_queues,
        workload_from_history,
    )
    from scheduler.simulate import Simulation

    workload, _recorded = workload_from_history(period)
    cluster = lab_cluster()
    sim = Simulation(
        workload,
        "labportal",
        gpus=4,
        per_node=PER_ADDED_NODE,
        slot_gpus=0,
        slots_per_gpu=4,
        timeslot_s=14400.0,
        cluster=cluster,
        policy=with_replay_queues(lab_policy()),
    )
    sim.run()
    ids = list(
        Job.objects.filter(
            submitted_at__gte=period.start, submitted_at__lt=period.end, ended_at__isnull=False
        )
        .order_by("submitted_at", "id")
        .values_list("id", flat=True)
    )
    jobs = [j for j in sim.jobs if j.queue != BOOKING_QUEUE]  # the bookings' blocks
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
    assert same.utilisation_pct == pytest.approx(recorded.utilisation_pct, rel=0.05)


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

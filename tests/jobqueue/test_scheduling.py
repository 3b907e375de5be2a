"""The scheduling pass: engine decisions applied atomically, dispatched on commit."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from cluster.models import Gpu, Node
from jobqueue.models import Allocation, EmergencyRequest, Job
from scheduling.passes import scheduling_pass
from tests.jobqueue.test_submit import submit

pytestmark = pytest.mark.django_db


def run_pass(capture: Any) -> Any:
    with capture(execute=True):
        return scheduling_pass()


def test_a_pass_starts_a_job_on_one_node_and_sends_it_to_that_nodes_queue(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any, sent_tasks: Any
) -> None:
    job = submit(alice, gpus=2)
    result = run_pass(django_capture_on_commit_callbacks)
    job.refresh_from_db()
    assert result.started == [job.pk]
    assert job.state == Job.State.DISPATCHED
    gpus = [a.gpu for a in job.allocations.filter(active=True)]
    assert len(gpus) == 2 and len({g.node_id for g in gpus}) == 1
    [(name, [spec], queue)] = sent_tasks.named("agent.start_job")
    assert job.node is not None
    assert queue == f"node.{job.node.name}"
    assert spec["job_id"] == job.pk
    assert sorted(spec["gpu_uuids"]) == sorted(g.uuid for g in gpus)
    assert spec["uid"] >= 20000 and spec["username"] == "alice"
    assert [e.kind for e in job.events.all()] == ["submitted", "dispatched"]


def test_partly_used_nodes_are_filled_first(
    alice: Any, bob: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    first = submit(alice, gpus=1)
    run_pass(django_capture_on_commit_callbacks)
    second = submit(bob, gpus=1)
    run_pass(django_capture_on_commit_callbacks)
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.node_id == second.node_id


def test_waiting_jobs_get_a_position_an_estimated_start_and_a_reason(
    alice: Any, bob: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    for _ in range(2):
        submit(alice, gpus=4, time_limit_s=3600)
    waiting = submit(bob, gpus=4, time_limit_s=3600)
    run_pass(django_capture_on_commit_callbacks)
    waiting.refresh_from_db()
    assert waiting.state == Job.State.PENDING
    assert waiting.queue_position == 1
    assert waiting.pending_reason == "resources"
    assert waiting.estimated_start is not None
    assert (
        timezone.now() < waiting.estimated_start <= timezone.now() + timedelta(hours=1, minutes=10)
    )
    assert waiting.pending_reason_text == "Waiting for GPUs to free up."


def test_an_older_pass_never_overwrites_the_places_a_newer_pass_stored(
    alice: Any, bob: Any, cluster: Any, image: Any
) -> None:
    for _ in range(2):
        submit(alice, gpus=4, time_limit_s=3600)
    waiting = submit(bob, gpus=4, time_limit_s=3600)
    now = timezone.now()
    scheduling_pass(now=now)
    Job.objects.filter(pk=waiting.pk).update(queue_position=99, pending_reason="")

    # A pass that planned earlier but stores late (its worker was slow) writes nothing...
    scheduling_pass(now=now - timedelta(seconds=5))
    waiting.refresh_from_db()
    assert (waiting.queue_position, waiting.pending_reason) == (99, "")

    # ...while the next pass stores its own figures.
    scheduling_pass(now=now + timedelta(seconds=5))
    waiting.refresh_from_db()
    assert (waiting.queue_position, waiting.pending_reason) == (1, "resources")


def test_a_moment_later_a_pass_rewrites_no_waiting_row_whose_figures_barely_moved(
    alice: Any, bob: Any, cluster: Any, image: Any
) -> None:
    for _ in range(2):
        submit(alice, gpus=4, time_limit_s=3600)
    waiting = submit(bob, gpus=4, time_limit_s=3600)
    now = timezone.now()
    scheduling_pass(now=now)
    waiting.refresh_from_db()
    stored = waiting.estimated_start
    assert stored is not None
    Job.objects.filter(pk=waiting.pk).update(estimated_start=stored + timedelta(seconds=10))

    # Estimates are shown to the minute: ten seconds of drift is not worth a write.
    scheduling_pass(now=now + timedelta(seconds=2))
    waiting.refresh_from_db()
    assert waiting.estimated_start == stored + timedelta(seconds=10)


def test_nothing_new_starts_on_a_draining_node(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    Node.objects.filter(name="gpu01").update(state=Node.State.DRAINING, drain_requested=True)
    Node.objects.filter(name="gpu02").update(state=Node.State.DOWN)
    job = submit(alice, gpus=1)
    run_pass(django_capture_on_commit_callbacks)
    job.refresh_from_db()
    assert job.state == Job.State.PENDING
    assert job.pending_reason == "node_unavailable"


def test_nothing_starts_on_a_monitor_only_node(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    # A Slurm node's agent reports telemetry only (runtime "none") and refuses commands.
    Node.objects.filter(name="gpu01").update(runtime="none")
    Node.objects.filter(name="gpu02").update(runtime="none")
    job = submit(alice, gpus=1)
    run_pass(django_capture_on_commit_callbacks)
    job.refresh_from_db()
    assert job.state == Job.State.PENDING
    assert job.pending_reason == "node_unavailable"
    Node.objects.filter(name="gpu02").update(runtime="docker")
    run_pass(django_capture_on_commit_callbacks)
    job.refresh_from_db()
    assert job.state == Job.State.DISPATCHED
    assert job.node is not None and job.node.name == "gpu02"


def test_a_held_job_does_not_start(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    job = submit(alice)
    Job.objects.filter(pk=job.pk).update(state=Job.State.HELD, hold_reason="waiting for approval")
    run_pass(django_capture_on_commit_callbacks)
    job.refresh_from_db()
    assert job.state == Job.State.HELD
    assert job.pending_reason == "held"


def test_an_approved_emergency_job_runs_first(
    alice: Any,
    bob: Any,
    admin_user: Any,
    cluster: Any,
    image: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    with time_machine.travel(timezone.now() - timedelta(hours=1)):
        early = submit(alice, gpus=8 // 2)
        early2 = submit(alice, gpus=4)
    submit(alice, gpus=4)
    urgent = submit(bob, gpus=4)
    request = EmergencyRequest.objects.create(
        user=bob,
        reason="camera-ready",
        state=EmergencyRequest.State.APPROVED,
        expires_at=timezone.now() + timedelta(hours=6),
    )
    request.jobs.add(urgent)
    run_pass(django_capture_on_commit_callbacks)
    urgent.refresh_from_db()
    early.refresh_from_db()
    early2.refresh_from_db()
    assert urgent.state == Job.State.DISPATCHED
    assert sorted([early.state, early2.state]) == [Job.State.DISPATCHED, Job.State.PENDING]


def test_a_gpu_cannot_hold_two_active_allocations(
    alice: Any, bob: Any, cluster: Any, image: Any
) -> None:
    gpu = Gpu.objects.first()
    assert gpu is not None
    a, b = submit(alice), submit(bob)
    Allocation.objects.create(job=a, gpu=gpu)
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(job=b, gpu=gpu)
    Allocation.objects.filter(job=a).update(active=False)
    Allocation.objects.create(job=b, gpu=gpu)


def test_a_users_usage_lowers_their_priority(
    alice: Any, bob: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    past = submit(alice, gpus=4)
    Job.objects.filter(pk=past.pk).update(
        state=Job.State.COMPLETED,
        started_at=timezone.now() - timedelta(hours=10),
        ended_at=timezone.now() - timedelta(hours=1),
    )
    a = submit(alice, gpus=1)
    b = submit(bob, gpus=1)
    Node.objects.filter(name="gpu02").update(state=Node.State.DOWN)
    for g in Gpu.objects.filter(node__name="gpu01")[:3]:
        blocker = submit(bob, gpus=1)
        Job.objects.filter(pk=blocker.pk).update(
            state=Job.State.RUNNING, node=g.node, started_at=timezone.now()
        )
        Allocation.objects.create(job=blocker, gpu=g)
    run_pass(django_capture_on_commit_callbacks)
    a.refresh_from_db()
    b.refresh_from_db()
    assert b.state == Job.State.DISPATCHED
    assert a.state == Job.State.PENDING and a.pending_reason in ("resources", "priority")


def test_the_predicted_run_time_learns_from_the_owners_finished_jobs(
    alice: Any, cluster: Any, image: Any
) -> None:
    first = submit(alice, time_limit_s=4 * 3600, command="python train.py --seed 1")
    assert first.predicted_runtime_s == 4 * 3600
    now = timezone.now()
    Job.objects.filter(pk=first.pk).update(
        state=Job.State.COMPLETED, started_at=now - timedelta(minutes=50), ended_at=now
    )
    second = submit(alice, time_limit_s=4 * 3600, command="python train.py --seed 2")
    assert second.predicted_runtime_s == 50 * 60


def book(user: Any, node_name: str, start: Any, end: Any) -> Any:
    from reservations.services import reservation_create

    node = Node.objects.get(name=node_name)
    return reservation_create(user=user, start=start, end=end, node=node, gpu_count=4)


def test_nothing_is_backfilled_into_someone_elses_reservation_window(
    alice: Any, bob: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    start = timezone.now().replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    with time_machine.travel(start - timedelta(minutes=30), tick=False):
        Node.objects.filter(name="gpu02").update(state=Node.State.DOWN)
        book(bob, "gpu01", start, start + timedelta(hours=2))
        too_long = submit(alice, gpus=1, time_limit_s=3600)
        fits = submit(alice, gpus=1, time_limit_s=20 * 60)
        run_pass(django_capture_on_commit_callbacks)
    too_long.refresh_from_db()
    fits.refresh_from_db()
    assert too_long.state == Job.State.PENDING
    assert too_long.pending_reason == "reservation"
    assert too_long.estimated_start is not None and too_long.estimated_start >= start + timedelta(
        hours=2
    )
    assert fits.state == Job.State.DISPATCHED


def test_the_owners_job_runs_in_the_reservation_ahead_of_everyone(
    alice: Any, bob: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    start = timezone.now().replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    with time_machine.travel(start - timedelta(minutes=30), tick=False):
        Node.objects.filter(name="gpu02").update(state=Node.State.DOWN)
        reservation = book(bob, "gpu01", start, start + timedelta(hours=2))
    with time_machine.travel(start + timedelta(minutes=1), tick=False):
        earlier = submit(alice, gpus=4, time_limit_s=600)
        mine = submit(bob, gpus=4, time_limit_s=3600, reservation_id=reservation.pk)
        run_pass(django_capture_on_commit_callbacks)
    mine.refresh_from_db()
    earlier.refresh_from_db()
    assert mine.state == Job.State.DISPATCHED
    assert {a.gpu_id for a in mine.allocations.all()} == set(
        reservation.gpus.values_list("id", flat=True)
    )
    assert earlier.state == Job.State.PENDING


def _finished(owner: Any, *, hours_ago: float, hours: float, gpus: int = 1) -> Job:
    job = submit(owner, gpus=gpus)
    now = timezone.now()
    Job.objects.filter(pk=job.pk).update(
        state=Job.State.COMPLETED,
        started_at=now - timedelta(hours=hours_ago + hours),
        ended_at=now - timedelta(hours=hours_ago),
    )
    return job


@pytest.mark.postgres
def test_usage_summed_by_postgresql_equals_the_engines_decay(
    alice: Any, bob: Any, cluster: Any, image: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scheduling import passes as scheduling

    _finished(alice, hours_ago=1, hours=5, gpus=2)
    _finished(alice, hours_ago=24 * 20, hours=30)
    _finished(bob, hours_ago=24 * 3, hours=2, gpus=4)
    running = submit(bob, gpus=1)
    Job.objects.filter(pk=running.pk).update(
        state=Job.State.RUNNING, started_at=timezone.now() - timedelta(hours=2)
    )
    now = timezone.now()
    in_sql = scheduling._usage(now, 7 * 86400.0)
    monkeypatch.setattr(connection, "vendor", "python-path")  # the SQLite path: Python sums
    in_python = scheduling._usage(now, 7 * 86400.0)

    assert in_sql.keys() == in_python.keys() == {"alice", "bob"}
    for user, value in in_python.items():
        assert in_sql[user] == pytest.approx(value, rel=1e-9)


def test_a_pass_reuses_usage_for_a_minute_then_sums_it_again(
    alice: Any, cluster: Any, image: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scheduling import passes as scheduling

    monkeypatch.setattr(scheduling, "USAGE_REUSE_S", 60.0)
    _finished(alice, hours_ago=1, hours=5)
    now = timezone.now()
    first = scheduling._usage_recent(now, 7 * 86400.0)
    _finished(alice, hours_ago=1, hours=5)  # doubles alice's usage

    within = scheduling._usage_recent(now + timedelta(seconds=30), 7 * 86400.0)
    after = scheduling._usage_recent(now + timedelta(seconds=61), 7 * 86400.0)

    decay = 0.5 ** (30 / (7 * 86400.0))
    assert within["alice"] == pytest.approx(first["alice"] * decay)
    assert after["alice"] == pytest.approx(2 * first["alice"], rel=1e-3)


def test_positions_estimates_and_reasons_are_stored_for_every_waiting_job(
    alice: Any, bob: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    waiting = [submit(owner, gpus=4) for owner in (alice, bob, alice, bob)]
    Node.objects.filter(name="gpu02").update(state=Node.State.DOWN)
    run_pass(django_capture_on_commit_callbacks)
    run_pass(django_capture_on_commit_callbacks)  # the second stores only what changed

    stored = {j.pk: j for j in Job.objects.filter(pk__in=[j.pk for j in waiting])}
    dispatched = [j for j in stored.values() if j.state == Job.State.DISPATCHED]
    pending = sorted(
        (j for j in stored.values() if j.state == Job.State.PENDING),
        key=lambda j: j.queue_position or 0,
    )
    assert len(dispatched) == 1
    assert [j.queue_position for j in pending] == [1, 2, 3]
    assert all(j.pending_reason and j.priority is not None for j in pending)


def test_the_pass_reads_emergencies_credit_and_gpus_with_the_rows_not_on_their_own(
    alice: Any, bob: Any, charlie: Any, cluster: Any, image: Any, sent_tasks: Any
) -> None:
    """What the engine is given is unchanged; only the round trips to read it are fewer."""
    from accounts.models import CreditAccount
    from scheduling.passes import build_engine_input

    running = submit(alice, gpus=2)
    scheduling_pass()
    urgent, late, plain = submit(bob), submit(charlie), submit(charlie)
    now = timezone.now()
    in_force = EmergencyRequest.objects.create(
        user=bob,
        reason="camera-ready",
        state=EmergencyRequest.State.APPROVED,
        expires_at=now + timedelta(hours=6),
    )
    in_force.jobs.add(urgent, running)
    lapsed = EmergencyRequest.objects.create(
        user=charlie,
        reason="too late",
        state=EmergencyRequest.State.APPROVED,
        expires_at=now - timedelta(minutes=1),
    )
    lapsed.jobs.add(late)
    CreditAccount.objects.update_or_create(user=bob, defaults={"balance": 5})
    CreditAccount.objects.update_or_create(user=alice, defaults={"balance": 0})

    with CaptureQueriesContext(connection) as queries:
        state, _policy, _gpus = build_engine_input(now)

    pending = {j.id: j for j in state.pending}
    assert pending[urgent.pk].emergency
    assert not pending[late.pk].emergency and not pending[plain.pk].emergency
    [run] = state.running
    assert run.id == running.pk and run.emergency
    held = Allocation.objects.filter(job_id=running.pk, active=True).values_list(
        "gpu__uuid", flat=True
    )
    assert sorted(run.gpu_ids) == sorted(held) and len(run.gpu_ids) == 2
    assert state.users_without_credit == frozenset({"alice", "charlie"})
    alone = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"]
        .lstrip()
        .startswith(('SELECT "jobqueue_emergencyrequest', 'SELECT "accounts_creditaccount'))
        or (
            connection.vendor == "postgresql" and q["sql"].startswith('SELECT "jobqueue_allocation')
        )
    ]
    assert alone == []
    # Settings, queues, categories, the categories' queue allowances, nodes, GPUs, running,
    # waiting, bookings, members, usage (and on SQLite the running jobs' GPUs): 14 statements
    # before emergencies, credit and GPUs came with the rows.
    assert len(queries.captured_queries) <= (11 if connection.vendor == "postgresql" else 12)


def test_grants_are_checked_only_while_a_job_waits_in_a_grant_only_queue(
    alice: Any, cluster: Any, image: Any, sent_tasks: Any
) -> None:
    from jobqueue.models import Queue

    submit(alice)
    with CaptureQueriesContext(connection) as quiet:
        scheduling_pass()
    # Asked with the pass lock, not in a statement of its own.
    assert not [
        q["sql"]
        for q in quiet.captured_queries
        if q["sql"].startswith('SELECT "jobqueue_job"')
        and "requires_grant" in q["sql"].partition(" WHERE ")[2]
    ]
    assert not any("jobqueue_prioritygrant" in q["sql"] for q in quiet.captured_queries)
    high = Queue.objects.filter(requires_grant=True).first()
    assert high is not None
    for _ in range(2):  # fill the cluster
        submit(alice, gpus=4)
    scheduling_pass()
    stranded = submit(alice)
    Job.objects.filter(pk=stranded.pk).update(queue=high)  # no grant in force
    with CaptureQueriesContext(connection) as checked:
        scheduling_pass()
    assert any("jobqueue_prioritygrant" in q["sql"] for q in checked.captured_queries)
    stranded.refresh_from_db()
    assert stranded.queue.requires_grant is False

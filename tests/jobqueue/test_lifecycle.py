"""Agent events, cancel, time limits and lost nodes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.utils import timezone

from cluster.protocol import MessageRefused
from jobqueue import errors
from jobqueue.models import Job, SchedulingPolicy
from jobqueue.services import job_cancel, jobs_enforce_time_limits
from scheduling.agent_events import job_event_apply, jobs_mark_lost_on_node
from scheduling.passes import scheduling_pass
from tests.jobqueue.test_submit import submit

pytestmark = pytest.mark.django_db


def dispatched(owner: Any, capture: Any, **overrides: Any) -> Job:
    job = submit(owner, **overrides)
    with capture(execute=True):
        scheduling_pass()
    job.refresh_from_db()
    assert job.state == Job.State.DISPATCHED
    return job


def node_name(job: Job) -> str:
    assert job.node is not None, f"job {job.pk} is on no node"
    return job.node.name


def event(job: Job, kind: str, **extra: Any) -> dict[str, Any]:
    return {
        "event_id": f"{job.pk}:{kind}:c1",
        "job_id": job.pk,
        "kind": kind,
        "container_id": "c1",
        "ts": timezone.now().timestamp(),
        "log_tail": "",
        "reason": "",
        "exit_code": None,
        **extra,
    }


def test_started_then_exited_zero_completes_and_frees_the_gpus(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    job = dispatched(alice, django_capture_on_commit_callbacks)
    job_event_apply(node_name=node_name(job), event=event(job, "started"))
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING and job.started_at is not None
    job_event_apply(
        node_name=node_name(job), event=event(job, "exited", exit_code=0, log_tail="done\n")
    )
    job.refresh_from_db()
    assert job.state == Job.State.COMPLETED
    assert job.exit_code == 0 and job.log_tail == "done\n"
    assert not job.allocations.filter(active=True).exists()


def test_the_same_event_twice_changes_nothing(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    job = dispatched(alice, django_capture_on_commit_callbacks)
    job_event_apply(node_name=node_name(job), event=event(job, "started"))
    exited = event(job, "exited", exit_code=3)
    job_event_apply(node_name=node_name(job), event=exited)
    job_event_apply(node_name=node_name(job), event=exited)
    job.refresh_from_db()
    assert job.state == Job.State.FAILED and job.exit_code == 3
    assert [e.kind for e in job.events.all()] == ["submitted", "dispatched", "started", "exited"]


def test_an_event_from_another_node_is_refused_and_changes_nothing(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    job = dispatched(alice, django_capture_on_commit_callbacks)
    other = "gpu02" if node_name(job) == "gpu01" else "gpu01"
    with pytest.raises(MessageRefused) as refused:
        job_event_apply(node_name=other, event=event(job, "exited", exit_code=0))
    assert refused.value.reason == "job_not_on_node"
    job.refresh_from_db()
    assert job.state == Job.State.DISPATCHED


def test_a_late_copy_of_an_applied_event_after_a_requeue_is_ignored_not_refused(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from jobqueue.services import job_requeue

    job = dispatched(alice, django_capture_on_commit_callbacks)
    first_node = node_name(job)
    started = event(job, "started")
    job_event_apply(node_name=first_node, event=started)
    job_requeue(job_id=job.pk, reason="node drained")
    # The broker redelivers the started event the agent sent before the requeue.
    job_event_apply(node_name=first_node, event=started)
    job.refresh_from_db()
    assert job.state == Job.State.PENDING and job.node is None
    # A new event for the job from that node is still refused.
    with pytest.raises(MessageRefused) as refused:
        job_event_apply(node_name=first_node, event=event(job, "exited", exit_code=0))
    assert refused.value.reason == "job_not_on_node"


def test_a_start_failure_fails_the_job_with_its_reason(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    job = dispatched(alice, django_capture_on_commit_callbacks)
    job_event_apply(
        node_name=node_name(job), event=event(job, "start_failed", reason="image not found on node")
    )
    job.refresh_from_db()
    assert job.state == Job.State.FAILED
    assert "image not found" in job.end_reason


def test_cancelling_a_waiting_job_ends_it_at_once(alice: Any, cluster: Any, image: Any) -> None:
    job = submit(alice)
    job_cancel(job_id=job.pk, actor=alice)
    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED


def test_cancelling_a_running_job_stops_its_container_and_ends_cancelled(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any, sent_tasks: Any
) -> None:
    job = dispatched(alice, django_capture_on_commit_callbacks)
    job_event_apply(node_name=node_name(job), event=event(job, "started"))
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job_id=job.pk, actor=alice)
    [(_name, args, queue)] = sent_tasks.named("agent.stop_job")
    assert args == [job.pk, SchedulingPolicy.current().stop_grace_s, "cancelled"]
    assert queue == f"node.{node_name(job)}"
    job_event_apply(node_name=node_name(job), event=event(job, "exited", exit_code=143))
    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED


def test_only_the_owner_or_an_admin_can_cancel(
    alice: Any, charlie: Any, admin_user: Any, cluster: Any, image: Any
) -> None:
    job = submit(alice)
    with pytest.raises(errors.NotJobOwner):
        job_cancel(job_id=job.pk, actor=charlie)
    job_cancel(job_id=job.pk, actor=admin_user)
    with pytest.raises(errors.InvalidTransition, match="has already ended"):
        job_cancel(job_id=job.pk, actor=alice)


def test_the_soft_limit_warns_and_the_hard_limit_stops(
    alice: Any,
    cluster: Any,
    image: Any,
    django_capture_on_commit_callbacks: Any,
    sent_tasks: Any,
    mailoutbox: Any,
) -> None:
    job = dispatched(alice, django_capture_on_commit_callbacks, time_limit_s=3600)
    job_event_apply(node_name=node_name(job), event=event(job, "started"))
    start = timezone.now()
    with time_machine.travel(start + timedelta(minutes=59)):
        assert jobs_enforce_time_limits() == {"warned": 0, "stopped": 0}
    with (
        time_machine.travel(start + timedelta(minutes=61)),
        django_capture_on_commit_callbacks(execute=True),
    ):
        assert jobs_enforce_time_limits() == {"warned": 1, "stopped": 0}
        assert jobs_enforce_time_limits() == {"warned": 0, "stopped": 0}
    job.refresh_from_db()
    assert job.soft_warned_at is not None
    assert "soft_limit" in [e.kind for e in job.events.all()]
    assert not sent_tasks.named("agent.stop_job")
    with (
        time_machine.travel(start + timedelta(minutes=60 + 31)),
        django_capture_on_commit_callbacks(execute=True),
    ):
        assert jobs_enforce_time_limits()["stopped"] == 1
    assert sent_tasks.named("agent.stop_job")[0][1][2] == "timed_out"
    job_event_apply(node_name=node_name(job), event=event(job, "exited", exit_code=137))
    job.refresh_from_db()
    assert job.state == Job.State.TIMED_OUT


def test_warn_only_policy_never_stops_a_job(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any, sent_tasks: Any
) -> None:
    SchedulingPolicy.objects.update_or_create(pk=1, defaults={"hard_limit_grace_s": None})
    job = dispatched(alice, django_capture_on_commit_callbacks, time_limit_s=600)
    job_event_apply(node_name=node_name(job), event=event(job, "started"))
    with (
        time_machine.travel(timezone.now() + timedelta(days=2)),
        django_capture_on_commit_callbacks(execute=True),
    ):
        assert jobs_enforce_time_limits() == {"warned": 1, "stopped": 0}
    assert not sent_tasks.named("agent.stop_job")


def test_jobs_on_a_lost_node_become_lost_once(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    job = dispatched(alice, django_capture_on_commit_callbacks)
    node_id = job.node_id
    assert node_id is not None
    assert jobs_mark_lost_on_node(node_id=node_id, reason="no heartbeat") == 1
    assert jobs_mark_lost_on_node(node_id=node_id, reason="no heartbeat") == 0
    job.refresh_from_db()
    assert job.state == Job.State.LOST
    assert not job.allocations.filter(active=True).exists()


def test_a_preempted_job_returns_to_the_queue_with_its_submit_time(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from jobqueue.services import job_request_stop

    job = dispatched(alice, django_capture_on_commit_callbacks, preemptible=True)
    submitted = job.submitted_at
    job_event_apply(node_name=node_name(job), event=event(job, "started"))
    job_request_stop(job_id=job.pk, reason="preempted")
    job_event_apply(node_name=node_name(job), event=event(job, "exited", exit_code=143))
    job.refresh_from_db()
    assert job.state == Job.State.PENDING
    assert job.submitted_at == submitted and job.node is None
    assert not job.allocations.filter(active=True).exists()

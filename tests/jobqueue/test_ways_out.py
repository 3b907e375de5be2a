"""Every state a job could get stuck in has a way out, and each is tested here.

- dispatched, its start lost: re-sent, then requeued, then failed (the heartbeat reconcile);
- dispatched, its "started" event lost: taken as started from the node's heartbeat;
- running, its exit lost: lost and refunded once its node stops reporting it;
- stop requested, never confirmed: re-sent, then ended by the portal (the time-limit beat);
- cancelled before the container existed: the stop is sent again once it starts;
- ended here but still running there (lost, forced): the node is told to stop it again;
- anything else: an admin's force end.
And event times: clamped to the job's run, refused far outside it.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
import time_machine
from django.conf import settings
from django.contrib.admin.sites import site
from django.test import Client
from django.utils import timezone

from accounts.models import LedgerEntry
from cluster.models import RejectedMessage
from cluster.protocol import MessageRefused
from core.errors import StaffOnly
from jobqueue.errors import InvalidTransition
from jobqueue.models import Job, SchedulingPolicy
from jobqueue.services import job_cancel, job_force_end, job_request_stop
from scheduling.agent_events import job_event_apply, jobs_escalate_stops, jobs_reconcile_with_node
from scheduling.tasks import jobs_enforce_time_limits_task
from tests.conftest import PASSWORD, api_as
from tests.jobqueue.test_lifecycle import dispatched, event, node_name

pytestmark = pytest.mark.django_db

ACK = timedelta(seconds=settings.LABPORTAL_START_ACK_S)
GRACE = timedelta(seconds=settings.LABPORTAL_JOB_UNREPORTED_GRACE_S)


def heartbeat(job: Job, *, running: Collection[int] = (), starting: Collection[int] = ()) -> Any:
    assert job.node_id is not None
    return jobs_reconcile_with_node(
        node_id=job.node_id, running_ids=frozenset(running), starting_ids=frozenset(starting)
    )


def running_job(owner: Any, capture: Any, **overrides: Any) -> Job:
    job = dispatched(owner, capture, **overrides)
    job_event_apply(node_name=node_name(job), event=event(job, "started"))
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING
    return job


@pytest.fixture
def on_commit(django_capture_on_commit_callbacks: Any) -> Any:
    return django_capture_on_commit_callbacks


# --- a lost start ---------------------------------------------------------------------


def test_a_start_the_node_never_acknowledges_is_sent_again_then_requeued(
    alice: Any, cluster: Any, image: Any, on_commit: Any, sent_tasks: Any
) -> None:
    job = dispatched(alice, on_commit)
    first_start = sent_tasks.named("agent.start_job")[-1]
    start = timezone.now()

    with time_machine.travel(start + ACK / 2):
        assert heartbeat(job)["resent"] == []  # not yet due
    for attempt in range(1, settings.LABPORTAL_START_RETRIES + 1):
        with (
            on_commit(execute=True),
            time_machine.travel(start + ACK * attempt + timedelta(seconds=1)),
        ):
            assert heartbeat(job)["resent"] == [job.pk]
        resent = sent_tasks.named("agent.start_job")[-1]
        assert resent[1] == first_start[1] and resent[2] == first_start[2], "the same start"
    with time_machine.travel(start + ACK * 10):
        assert heartbeat(job)["requeued"] == [job.pk]

    job.refresh_from_db()
    assert job.state == Job.State.PENDING and job.node is None
    assert not job.allocations.filter(active=True).exists(), "its GPUs are free again"
    assert "never acknowledged" in job.events.filter(kind="requeued").get().message


def test_a_job_that_is_never_started_after_several_dispatches_fails(
    alice: Any, cluster: Any, image: Any, on_commit: Any
) -> None:
    job = dispatched(alice, on_commit)
    Job.objects.filter(pk=job.pk).update(
        dispatch_count=settings.LABPORTAL_MAX_DISPATCHES,
        start_resends=settings.LABPORTAL_START_RETRIES,
    )

    with time_machine.travel(timezone.now() + ACK * 2):
        assert heartbeat(job)["failed"] == [job.pk]

    job.refresh_from_db()
    assert job.state == Job.State.FAILED and "never started" in job.end_reason
    assert not job.allocations.filter(active=True).exists()


def test_a_node_that_is_still_starting_the_job_is_left_alone(
    alice: Any, cluster: Any, image: Any, on_commit: Any, sent_tasks: Any
) -> None:
    job = dispatched(alice, on_commit)
    starts = len(sent_tasks.named("agent.start_job"))

    with time_machine.travel(timezone.now() + ACK * 5):
        assert not any(heartbeat(job, starting={job.pk}).values())

    job.refresh_from_db()
    assert job.state == Job.State.DISPATCHED
    assert len(sent_tasks.named("agent.start_job")) == starts


def test_a_job_the_node_runs_but_whose_started_event_was_lost_is_taken_as_started(
    alice: Any, cluster: Any, image: Any, on_commit: Any
) -> None:
    job = dispatched(alice, on_commit)
    first_seen = timezone.now()

    with time_machine.travel(first_seen, tick=False):
        assert not any(heartbeat(job, running={job.pk}).values())  # may just be in flight
    with time_machine.travel(first_seen + GRACE):
        assert heartbeat(job, running={job.pk})["taken_as_started"] == [job.pk]

    job.refresh_from_db()
    assert job.state == Job.State.RUNNING and job.started_at == first_seen


# --- a lost exit ------------------------------------------------------------------------


def test_a_running_job_its_node_stops_reporting_is_lost_and_refunded(
    alice: Any, cluster: Any, image: Any, on_commit: Any
) -> None:
    job = running_job(alice, on_commit)
    gone = timezone.now() + timedelta(minutes=1)

    with time_machine.travel(gone, tick=False):
        assert not any(heartbeat(job).values())
    with time_machine.travel(gone + GRACE / 2):
        assert heartbeat(job, running=set())["lost"] == []
    with time_machine.travel(gone + GRACE), on_commit(execute=True):
        assert heartbeat(job)["lost"] == [job.pk]

    job.refresh_from_db()
    assert job.state == Job.State.LOST and job.ended_at == gone
    assert "end was never received" in job.end_reason
    assert not job.allocations.filter(active=True).exists()


def test_a_job_reported_again_within_the_grace_keeps_running(
    alice: Any, cluster: Any, image: Any, on_commit: Any
) -> None:
    job = running_job(alice, on_commit)
    start = timezone.now()

    with time_machine.travel(start):
        heartbeat(job)
    with time_machine.travel(start + GRACE / 2):
        heartbeat(job, running={job.pk})
    with time_machine.travel(start + GRACE * 2):
        assert not any(heartbeat(job, running={job.pk}).values())

    job.refresh_from_db()
    assert job.state == Job.State.RUNNING and job.unreported_since is None


def test_a_lost_job_still_running_on_its_node_is_told_to_stop(
    alice: Any, cluster: Any, image: Any, on_commit: Any, sent_tasks: Any
) -> None:
    job = running_job(alice, on_commit)
    Job.objects.filter(pk=job.pk).update(state=Job.State.LOST)

    with on_commit(execute=True):
        assert heartbeat(job, running={job.pk})["stopped"] == [job.pk]
        assert heartbeat(job, running={job.pk})["stopped"] == [], "once per grace period"

    [(_name, args, _queue)] = sent_tasks.named("agent.stop_job")
    assert args[0] == job.pk


def test_a_container_of_a_job_that_is_not_this_nodes_is_stopped(
    alice: Any, cluster: Any, image: Any, on_commit: Any, sent_tasks: Any
) -> None:
    job = dispatched(alice, on_commit)
    elsewhere = next(n for n in cluster if n.pk != job.node_id)

    with on_commit(execute=True):
        acted = jobs_reconcile_with_node(node_id=elsewhere.pk, running_ids=frozenset({job.pk}))

    assert acted["stopped"] == [job.pk]
    [(_name, args, queue)] = sent_tasks.named("agent.stop_job")
    assert queue == elsewhere.queue_name and args[0] == job.pk


# --- stops -----------------------------------------------------------------------------


def test_a_stop_that_is_never_confirmed_is_resent_then_the_portal_ends_the_job(
    alice: Any, cluster: Any, image: Any, on_commit: Any, sent_tasks: Any
) -> None:
    job = running_job(alice, on_commit)
    with on_commit(execute=True):
        job_cancel(job_id=job.pk, actor=alice)
    asked = timezone.now()
    wait = timedelta(
        seconds=SchedulingPolicy.current().stop_grace_s + settings.LABPORTAL_STOP_CONFIRM_S
    )

    for attempt in range(1, settings.LABPORTAL_STOP_RETRIES + 1):
        with (
            on_commit(execute=True),
            time_machine.travel(asked + wait * attempt + timedelta(seconds=1)),
        ):
            assert jobs_escalate_stops() == {"stops_resent": 1, "ended_unconfirmed": 0}
    assert len(sent_tasks.named("agent.stop_job")) == 1 + settings.LABPORTAL_STOP_RETRIES
    with on_commit(execute=True), time_machine.travel(asked + wait * 10):
        result = jobs_enforce_time_limits_task()

    assert result["ended_unconfirmed"] == 1
    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED
    assert not job.allocations.filter(active=True).exists()
    # Charged as if the stop had worked, not for the time the node ignored it.
    assert job.ended_at is not None
    assert job.ended_at - asked <= timedelta(seconds=SchedulingPolicy.current().stop_grace_s + 1)
    assert "did not confirm the stop" in job.events.get(kind="force_ended").message


def test_the_time_limit_beat_escalates_a_timed_out_job_whose_stop_was_lost(
    alice: Any, cluster: Any, image: Any, on_commit: Any
) -> None:
    job = running_job(alice, on_commit, time_limit_s=60)
    policy = SchedulingPolicy.current()
    assert policy.hard_limit_grace_s is not None
    past_hard_limit = timezone.now() + timedelta(seconds=60 + policy.hard_limit_grace_s + 1)
    with on_commit(execute=True), time_machine.travel(past_hard_limit):
        assert jobs_enforce_time_limits_task()["stopped"] == 1

    with on_commit(execute=True), time_machine.travel(past_hard_limit + timedelta(days=1)):
        for _ in range(settings.LABPORTAL_STOP_RETRIES + 1):
            jobs_enforce_time_limits_task()
            Job.objects.filter(pk=job.pk).update(stop_sent_at=timezone.now() - timedelta(hours=1))

    job.refresh_from_db()
    assert job.state == Job.State.TIMED_OUT


def test_a_preempted_job_whose_stop_is_never_confirmed_is_requeued_not_ended(
    alice: Any, cluster: Any, image: Any, on_commit: Any
) -> None:
    job = running_job(alice, on_commit, preemptible=True)
    with on_commit(execute=True):
        job_request_stop(job_id=job.pk, reason="preempted")
    Job.objects.filter(pk=job.pk).update(stop_resends=settings.LABPORTAL_STOP_RETRIES)

    with on_commit(execute=True), time_machine.travel(timezone.now() + timedelta(hours=1)):
        assert jobs_escalate_stops()["ended_unconfirmed"] == 1

    job.refresh_from_db()
    assert job.state == Job.State.PENDING and job.node is None
    assert not job.allocations.filter(active=True).exists()


def test_a_cancel_that_reached_the_node_before_the_container_is_sent_again_once_it_starts(
    alice: Any, cluster: Any, image: Any, on_commit: Any, sent_tasks: Any
) -> None:
    job = dispatched(alice, on_commit)
    with on_commit(execute=True):
        job_cancel(job_id=job.pk, actor=alice)  # the agent finds no container: nothing happens
    with on_commit(execute=True):
        job_event_apply(node_name=node_name(job), event=event(job, "started"))

    assert len(sent_tasks.named("agent.stop_job")) == 2
    assert sent_tasks.named("agent.stop_job")[-1][1][2] == "cancelled"


def test_a_cancelled_dispatched_job_the_node_never_had_ends_cancelled(
    alice: Any, cluster: Any, image: Any, on_commit: Any
) -> None:
    job = dispatched(alice, on_commit)
    with on_commit(execute=True):
        job_cancel(job_id=job.pk, actor=alice)
    start = timezone.now()

    with time_machine.travel(start, tick=False):
        heartbeat(job)
    with time_machine.travel(start + GRACE):
        assert heartbeat(job)["ended"] == [job.pk]

    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED
    assert not job.allocations.filter(active=True).exists()


def test_an_active_job_with_no_node_is_ended(
    alice: Any, cluster: Any, image: Any, on_commit: Any
) -> None:
    job = running_job(alice, on_commit)
    Job.objects.filter(pk=job.pk).update(node=None)  # nothing could ever stop it

    assert jobs_escalate_stops()["ended_unconfirmed"] == 1

    job.refresh_from_db()
    assert job.state == Job.State.LOST


# --- force end -------------------------------------------------------------------------


def test_an_admin_can_force_end_a_job_whose_node_ignores_it(
    alice: Any, admin_user: Any, cluster: Any, image: Any, on_commit: Any, sent_tasks: Any
) -> None:
    job = running_job(alice, on_commit)

    with on_commit(execute=True):
        job_force_end(job_id=job.pk, actor=admin_user)

    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED and job.ended_at is not None
    assert not job.allocations.filter(active=True).exists()
    assert job.events.get(kind="force_ended").actor == admin_user
    assert sent_tasks.named("agent.stop_job"), "the node is still told to stop it"
    with pytest.raises(InvalidTransition):
        job_force_end(job_id=job.pk, actor=admin_user)


def test_members_cannot_force_end_even_their_own_job(
    alice: Any, cluster: Any, image: Any, on_commit: Any
) -> None:
    job = running_job(alice, on_commit)

    with pytest.raises(StaffOnly):
        job_force_end(job_id=job.pk, actor=alice)
    response = api_as(alice).post(f"/api/jobs/{job.pk}/force-end/")

    assert response.status_code == 403
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING


def test_the_api_force_end_answers_staff_and_refuses_an_ended_job(
    alice: Any, admin_user: Any, cluster: Any, image: Any, on_commit: Any
) -> None:
    job = running_job(alice, on_commit)
    client = api_as(admin_user)

    first = client.post(f"/api/jobs/{job.pk}/force-end/")
    second = client.post(f"/api/jobs/{job.pk}/force-end/")

    assert first.status_code == 200 and first.json()["state"] == "cancelled"
    assert second.status_code == 409


def test_the_admin_action_force_ends_the_selected_jobs(
    alice: Any, admin_user: Any, cluster: Any, image: Any, on_commit: Any
) -> None:
    assert "force_end" in site._registry[Job].get_actions(_admin_request(admin_user))
    job = running_job(alice, on_commit)
    client = Client()
    client.login(username=admin_user.username, password=PASSWORD)

    response = client.post(
        "/admin/jobqueue/job/",
        {"action": "force_end", "_selected_action": [job.pk]},
        follow=True,
    )

    assert response.status_code == 200
    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED


def _admin_request(user: Any) -> Any:
    from django.test import RequestFactory

    request = RequestFactory().get("/admin/jobqueue/job/")
    request.user = user
    return request


# --- event times ------------------------------------------------------------------------


def test_a_started_event_dated_a_year_ago_is_refused_and_charges_nothing(
    alice: Any, cluster: Any, image: Any, on_commit: Any
) -> None:
    job = dispatched(alice, on_commit)
    a_year_ago = (timezone.now() - timedelta(days=365)).timestamp()

    with pytest.raises(MessageRefused) as refused:
        job_event_apply(node_name=node_name(job), event=event(job, "started", ts=a_year_ago))

    assert refused.value.reason == RejectedMessage.Reason.BAD_TIME
    job.refresh_from_db()
    assert job.state == Job.State.DISPATCHED and job.started_at is None
    assert not LedgerEntry.objects.filter(job=job).exists()


def test_an_event_a_little_before_the_dispatch_is_clamped_to_it(
    alice: Any, cluster: Any, image: Any, on_commit: Any
) -> None:
    job = dispatched(alice, on_commit)
    assert job.dispatched_at is not None
    early = (job.dispatched_at - timedelta(seconds=20)).timestamp()

    job_event_apply(node_name=node_name(job), event=event(job, "started", ts=early))

    job.refresh_from_db()
    assert job.started_at == job.dispatched_at


def test_an_exit_dated_in_the_future_is_clamped_to_now_and_far_future_refused(
    alice: Any, cluster: Any, image: Any, on_commit: Any
) -> None:
    job = running_job(alice, on_commit)
    now = timezone.now()
    with pytest.raises(MessageRefused):
        job_event_apply(
            node_name=node_name(job),
            event=event(job, "exited", exit_code=0, ts=(now + timedelta(days=2)).timestamp()),
        )

    with time_machine.travel(now, tick=False), on_commit(execute=True):
        job_event_apply(
            node_name=node_name(job),
            event=event(job, "exited", exit_code=0, ts=(now + timedelta(seconds=30)).timestamp()),
        )

    job.refresh_from_db()
    assert job.state == Job.State.COMPLETED and job.ended_at == now
    charged = -sum((e.amount for e in LedgerEntry.objects.filter(job=job)), Decimal(0))
    assert charged < Decimal("1"), "a job of a few seconds costs a few seconds"

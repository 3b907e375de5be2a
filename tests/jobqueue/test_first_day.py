"""What a member meets on the first day: wording, ordering, notifications and outcomes."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone, translation

from accounts.models import Notification
from core.durations import hours_minutes
from jobqueue import errors
from jobqueue.models import Job, JobEvent, PriorityGrant, Queue
from jobqueue.services import job_hold, job_release
from scheduling.agent_events import job_event_apply
from scheduling.passes import scheduling_pass
from tests.jobqueue.test_lifecycle import dispatched, event, node_name
from tests.jobqueue.test_submit import submit

pytestmark = pytest.mark.django_db


def finish(job: Job, exit_code: int, *, ran_s: float = 600) -> Job:
    start = timezone.now() - timedelta(seconds=ran_s)
    # Dispatched before it started (the portal refuses events dated outside the run).
    Job.objects.filter(pk=job.pk).update(dispatched_at=start - timedelta(seconds=1))
    job_event_apply(node_name=node_name(job), event=event(job, "started", ts=start.timestamp()))
    job_event_apply(node_name=node_name(job), event=event(job, "exited", exit_code=exit_code))
    job.refresh_from_db()
    return job


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(14400, "4 h"), (5400, "1 h 30 min"), (2700, "45 min"), (20, "20 s"), (3660, "1 h 1 min")],
)
def test_lengths_of_time_read_as_hours_and_minutes(seconds: int, text: str) -> None:
    assert hours_minutes(seconds) == text


def test_a_job_no_pass_has_seen_yet_is_being_scheduled_not_unknown(
    alice: Any, cluster: Any, image: Any, client: Client
) -> None:
    job = submit(alice)
    client.force_login(alice)
    html = client.get(reverse("job_detail", args=[job.pk])).content.decode()
    assert "being scheduled" in html
    assert "unknown" not in html
    assert "Waiting behind jobs with higher priority" not in html


def test_another_member_reads_a_limit_reason_about_the_owner_not_about_themselves(
    alice: Any, bob: Any, cluster: Any, image: Any, client: Client
) -> None:
    job = submit(alice)
    Job.objects.filter(pk=job.pk).update(pending_reason="category_limit", queue_position=1)
    client.force_login(bob)
    html = client.get(reverse("queue_overview")).content.decode()
    assert "Its owner&#x27;s category is at its limit" in html
    assert "Your category" not in html
    client.force_login(alice)
    assert "Your category is at its limit" in client.get(reverse("queue_overview")).content.decode()


def test_an_exit_reported_with_an_earlier_clock_is_still_listed_after_the_start(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    job = dispatched(alice, django_capture_on_commit_callbacks)
    now = timezone.now()
    # The exit arrives first, stamped by a node clock that lags the portal's.
    job_event_apply(
        node_name=node_name(job),
        event=event(job, "exited", exit_code=0, ts=(now - timedelta(seconds=30)).timestamp()),
    )
    job_event_apply(
        node_name=node_name(job),
        event=event(job, "started", ts=(now - timedelta(seconds=30)).timestamp()),
    )
    kinds = [e.kind for e in job.events.all()]
    assert kinds.index("dispatched") < kinds.index("started") < kinds.index("exited")


def test_events_are_stored_in_english_and_shown_in_the_readers_language(
    alice: Any, cluster: Any, image: Any, client: Client
) -> None:
    with translation.override("zh-hans"):
        job = submit(alice)  # e.g. submitted from the Chinese UI
    submitted = job.events.get(kind="submitted")
    assert submitted.message == "Submitted to the normal queue."
    with translation.override("zh-hans"):
        assert submitted.text == "已提交到 normal 队列。"
        assert submitted.kind_label == "已提交"
    client.force_login(alice)
    client.post(reverse("set_language"), {"language": "zh-hans", "next": "/"})
    html = client.get(reverse("job_detail", args=[job.pk])).content.decode()
    assert "已提交到 normal 队列。" in html
    assert "Submitted to the normal queue." not in html


@pytest.mark.parametrize(
    ("exit_code", "state", "title"),
    [(0, Job.State.COMPLETED, "completed"), (3, Job.State.FAILED, "failed")],
)
def test_the_owner_is_told_when_a_job_completes_or_fails(
    alice: Any,
    cluster: Any,
    image: Any,
    django_capture_on_commit_callbacks: Any,
    exit_code: int,
    state: str,
    title: str,
) -> None:
    job = dispatched(alice, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):  # written after the end's commit
        job = finish(job, exit_code, ran_s=5400)
    assert job.state == state
    note = Notification.objects.get(user=alice, kind=f"job_{state}")
    assert note.title == f"Job #{job.pk} {title}"
    assert "1 h 30 min" in note.body
    assert note.url == f"/jobs/{job.pk}/"


def test_a_member_who_turned_job_end_notifications_off_gets_none(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    alice.notify_job_end = False
    alice.save()
    job = dispatched(alice, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        finish(job, 0)
    assert not Notification.objects.filter(user=alice, kind__startswith="job_").exists()


def test_a_job_end_notification_is_written_in_the_members_language(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    alice.preferred_language = "zh-hans"
    alice.save()
    job = dispatched(alice, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        job = finish(job, 1)
    note = Notification.objects.get(user=alice, kind="job_failed")
    assert note.title == f"作业 #{job.pk} 失败"


def test_the_notification_setting_is_on_the_notifications_page(alice: Any, client: Client) -> None:
    client.force_login(alice)
    response = client.post(reverse("notification_settings"), {})
    assert response.status_code == 302
    alice.refresh_from_db()
    assert alice.notify_job_end is False
    client.post(reverse("notification_settings"), {"notify_job_end": "on"})
    alice.refresh_from_db()
    assert alice.notify_job_end is True
    assert 'name="notify_job_end"' in client.get(reverse("notifications")).content.decode()


def test_a_finished_jobs_page_shows_how_long_it_ran_and_what_it_cost(
    alice: Any,
    cluster: Any,
    image: Any,
    django_capture_on_commit_callbacks: Any,
    client: Client,
) -> None:
    job = dispatched(alice, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        job = finish(job, 0, ran_s=3 * 3600)
    client.force_login(alice)
    html = client.get(reverse("job_detail", args=[job.pk])).content.decode()
    assert "Ran for" in html and "3 h" in html
    charged = -sum(e.amount for e in job.ledger_entries.all())
    assert charged > Decimal("0")
    assert f"{charged:.2f}" in html
    assert "14400 s" not in html and "4 h" in html  # the time limit, in hours


def test_a_running_jobs_cancel_button_asks_first(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any, client: Client
) -> None:
    job = dispatched(alice, django_capture_on_commit_callbacks)
    client.force_login(alice)
    html = client.get(reverse("job_detail", args=[job.pk])).content.decode()
    assert "data-confirm=" in html and "unsaved work is lost" in html


def test_a_waiting_high_queue_job_moves_to_normal_once_its_grant_lapses(
    alice: Any, admin_user: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    high = Queue.objects.get(name="high")
    grant = PriorityGrant.objects.create(
        user=alice,
        queue=high,
        reason="paper",
        deadline=timezone.now() + timedelta(days=1),
        state=PriorityGrant.State.APPROVED,
    )
    job = submit(alice, queue="high", gpus=64 // 16)
    Job.objects.filter(pk=job.pk).update(state=Job.State.HELD, hold_reason="x")  # keep it waiting
    PriorityGrant.objects.filter(pk=grant.pk).update(deadline=timezone.now() - timedelta(hours=1))
    with django_capture_on_commit_callbacks(execute=True):
        scheduling_pass()
    job.refresh_from_db()
    assert job.queue.name == "normal"
    moved = job.events.filter(kind="requeued").last()
    assert moved is not None and "no longer in force" in moved.message


def test_a_job_whose_grant_is_in_force_keeps_its_queue(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    PriorityGrant.objects.create(
        user=alice,
        queue=Queue.objects.get(name="high"),
        reason="paper",
        deadline=timezone.now() + timedelta(days=1),
        state=PriorityGrant.State.APPROVED,
    )
    job = submit(alice, queue="high")
    Job.objects.filter(pk=job.pk).update(state=Job.State.HELD, hold_reason="x")
    with django_capture_on_commit_callbacks(execute=True):
        scheduling_pass()
    job.refresh_from_db()
    assert job.queue.name == "high"


def test_an_admin_hold_keeps_a_job_waiting_with_the_reason_until_released(
    alice: Any, admin_user: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    job = submit(alice)
    job_hold(job_id=job.pk, actor=admin_user, reason="disk full on gpu01")
    with django_capture_on_commit_callbacks(execute=True):
        scheduling_pass()
    job.refresh_from_db()
    assert job.state == Job.State.HELD
    assert "disk full on gpu01" in job.pending_reason_text
    with pytest.raises(errors.InvalidTransition):
        job_hold(job_id=job.pk, actor=admin_user, reason="again")
    job_release(job_id=job.pk, actor=admin_user)
    with django_capture_on_commit_callbacks(execute=True):
        scheduling_pass()
    job.refresh_from_db()
    assert job.state == Job.State.DISPATCHED
    assert [e.kind for e in job.events.all()][:3] == ["submitted", "held", "released"]


def test_every_event_kind_the_portal_records_has_a_translated_label() -> None:
    with translation.override("zh-hans"):
        for kind in JobEvent.STEPS:
            label = str(JobEvent.KIND_LABELS[kind])
            assert label and label != kind, kind

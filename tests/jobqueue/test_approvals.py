"""Priority grants and the emergency channel: who may do what, limits, expiry and the audit trail."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.utils import timezone

from accounts.models import CreditPolicy, Notification
from approvals import services as approvals
from jobqueue.models import EmergencyRequest, Job, PriorityGrant
from tests.factories import ContainerImageFactory, default_queue

pytestmark = pytest.mark.django_db

REASON = "Camera-ready experiments for NeurIPS"


def waiting_job(owner: Any, state: str = Job.State.PENDING) -> Job:
    return Job.objects.create(
        owner=owner,
        queue=default_queue("normal"),
        image=ContainerImageFactory.create(),
        command=["python", "t.py"],
        gpus=1,
        time_limit_s=3600,
        state=state,
    )


def apply(user: Any, days: int = 7) -> PriorityGrant:
    return approvals.grant_apply(
        user=user, reason=REASON, deadline=timezone.now() + timedelta(days=days), gpus_expected=4
    )


def test_a_member_applies_for_the_high_queue_and_staff_are_told(
    alice: Any, admin_user: Any
) -> None:
    grant = apply(alice)
    assert grant.queue.name == "high" and grant.state == PriorityGrant.State.PENDING
    assert Notification.objects.filter(user=admin_user, kind="grant_requested").exists()


@pytest.mark.parametrize(
    ("reason", "days", "message"),
    [
        ("short", 7, "Say in a sentence"),
        (REASON, -1, "must be in the future"),
        (REASON, 400, "at most 366 days"),
    ],
)
def test_a_bad_grant_request_says_how_to_fix_it(
    alice: Any, reason: str, days: int, message: str
) -> None:
    with pytest.raises(approvals.InvalidGrantRequest, match=message):
        approvals.grant_apply(
            user=alice,
            reason=reason,
            deadline=timezone.now() + timedelta(days=days),
            gpus_expected=1,
        )


def test_a_second_pending_request_for_the_same_queue_is_refused(alice: Any) -> None:
    apply(alice)
    with pytest.raises(approvals.DuplicateRequest):
        apply(alice)


def test_staff_approve_a_grant_with_a_comment_and_the_member_is_notified(
    alice: Any, admin_user: Any
) -> None:
    grant = approvals.grant_decide(
        grant_id=apply(alice).pk, decided_by=admin_user, approve=True, comment="Good luck"
    )
    assert grant.state == PriorityGrant.State.APPROVED and grant.decided_by == admin_user
    assert list(PriorityGrant.objects.in_force().filter(user=alice, queue=grant.queue)) == [grant]
    note = Notification.objects.get(user=alice, kind="grant_approved")
    assert "Good luck" in note.body


@pytest.mark.parametrize("member", ["alice", "bob", "charlie"])
def test_members_cannot_approve_any_grant(alice: Any, bob: Any, charlie: Any, member: str) -> None:
    grant = apply(alice)
    with pytest.raises(approvals.StaffOnly):
        approvals.grant_decide(
            grant_id=grant.pk,
            decided_by={"alice": alice, "bob": bob, "charlie": charlie}[member],
            approve=True,
        )
    grant.refresh_from_db()
    assert grant.state == PriorityGrant.State.PENDING


def test_a_decided_grant_cannot_be_decided_again(alice: Any, admin_user: Any) -> None:
    grant = apply(alice)
    approvals.grant_decide(grant_id=grant.pk, decided_by=admin_user, approve=False)
    with pytest.raises(approvals.AlreadyDecided):
        approvals.grant_decide(grant_id=grant.pk, decided_by=admin_user, approve=True)


def test_an_approved_grant_lapses_by_itself_at_its_deadline_and_the_member_is_told_once(
    alice: Any, admin_user: Any
) -> None:
    grant = approvals.grant_decide(
        grant_id=apply(alice, days=2).pk, decided_by=admin_user, approve=True
    )
    with time_machine.travel(timezone.now() + timedelta(days=3)):
        assert not grant.is_in_force()
        assert not PriorityGrant.objects.in_force().filter(user=alice, queue=grant.queue).exists()
        assert approvals.grants_expire() == 1
        assert approvals.grants_expire() == 0
    assert Notification.objects.filter(user=alice, kind="grant_lapsed").count() == 1


def test_an_undecided_request_ends_rejected_when_its_deadline_passes(alice: Any) -> None:
    grant = apply(alice, days=1)
    with time_machine.travel(timezone.now() + timedelta(days=2)):
        approvals.grants_expire()
    grant.refresh_from_db()
    assert grant.state == PriorityGrant.State.REJECTED and grant.decided_by is None


def test_a_member_withdraws_their_own_grant_but_not_someone_elses(alice: Any, charlie: Any) -> None:
    grant = apply(alice)
    with pytest.raises(approvals.NotAllowed):
        approvals.grant_withdraw(grant_id=grant.pk, user=charlie)
    assert (
        approvals.grant_withdraw(grant_id=grant.pk, user=alice).state
        == PriorityGrant.State.WITHDRAWN
    )
    assert PriorityGrant.objects.filter(pk=grant.pk).exists()


def ask(user: Any, jobs: list[Job], hours: int | None = None) -> EmergencyRequest:
    return approvals.emergency_request_create(
        user=user,
        job_ids=[j.pk for j in jobs],
        reason="The thesis defence is tomorrow",
        hours=hours,
    )


def test_an_approved_emergency_lasts_the_hours_asked_for(alice: Any, admin_user: Any) -> None:
    job = waiting_job(alice)
    request = ask(alice, [job], hours=6)
    decided = approvals.emergency_decide(request_id=request.pk, decided_by=admin_user, approve=True)
    assert decided.decided_at is not None
    assert decided.expires_at == decided.decided_at + timedelta(hours=6)
    assert decided.is_in_force()
    with time_machine.travel(timezone.now() + timedelta(hours=7)):
        assert not decided.is_in_force()
        assert approvals.emergencies_expire() == 1
    decided.refresh_from_db()
    assert decided.state == EmergencyRequest.State.EXPIRED
    assert Notification.objects.filter(user=alice, kind="emergency_approved").exists()


def test_an_emergency_whose_jobs_all_ended_cannot_be_approved_nor_use_the_quota(
    alice: Any, admin_user: Any
) -> None:
    done, cancelled = waiting_job(alice), waiting_job(alice)
    request = ask(alice, [done, cancelled])
    left = approvals.emergency_uses_left(alice)
    Job.objects.filter(pk=done.pk).update(state=Job.State.COMPLETED)
    Job.objects.filter(pk=cancelled.pk).update(state=Job.State.CANCELLED)
    with pytest.raises(approvals.EmergencyJobsFinished, match="already ended"):
        approvals.emergency_decide(request_id=request.pk, decided_by=admin_user, approve=True)
    request.refresh_from_db()
    assert request.state == EmergencyRequest.State.PENDING
    assert approvals.emergency_uses_left(alice) == left
    # Rejecting it still works; one job still waiting is enough to approve another.
    approvals.emergency_decide(request_id=request.pk, decided_by=admin_user, approve=False)
    other = ask(alice, [waiting_job(alice)])
    approved = approvals.emergency_decide(request_id=other.pk, decided_by=admin_user, approve=True)
    assert approved.state == EmergencyRequest.State.APPROVED


def test_the_approvals_page_shows_each_emergency_jobs_current_state(
    client: Any, alice: Any, admin_user: Any
) -> None:
    job = waiting_job(alice)
    ask(alice, [job])
    Job.objects.filter(pk=job.pk).update(state=Job.State.CANCELLED)
    client.force_login(admin_user)
    html = client.get("/jobs/approvals/").content.decode()
    assert f'#{job.pk}</a> <span class="state state-cancelled"' in html
    client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/"})
    assert "已取消" in client.get("/jobs/approvals/").content.decode()


def test_an_emergency_names_only_the_members_own_waiting_jobs(alice: Any, charlie: Any) -> None:
    with pytest.raises(approvals.InvalidEmergencyRequest, match="not waiting jobs of yours"):
        ask(charlie, [waiting_job(alice)])
    with pytest.raises(approvals.InvalidEmergencyRequest, match="not waiting jobs of yours"):
        ask(alice, [waiting_job(alice, state=Job.State.RUNNING)])
    assert ask(alice, [waiting_job(alice, state=Job.State.HELD)]).jobs.count() == 1


def test_each_member_may_use_the_emergency_channel_only_n_times_per_period(
    alice: Any, bob: Any, admin_user: Any
) -> None:
    CreditPolicy.objects.update_or_create(
        pk=1, defaults={"emergency_max_uses": 2, "emergency_period_days": 90}
    )
    start = timezone.now()
    for day in (0, 10):
        with time_machine.travel(start + timedelta(days=day)):
            request = ask(alice, [waiting_job(alice)])
            approvals.emergency_decide(request_id=request.pk, decided_by=admin_user, approve=True)
    with time_machine.travel(start + timedelta(days=20)):
        assert approvals.emergency_uses_left(alice) == 0
        with pytest.raises(
            approvals.EmergencyLimitReached, match="used all 2 emergencies of the last 90 days"
        ):
            ask(alice, [waiting_job(alice)])
        assert approvals.emergency_uses_left(bob) == 2  # the limit is per member
    with time_machine.travel(start + timedelta(days=91)):
        assert approvals.emergency_uses_left(alice) == 1
        ask(alice, [waiting_job(alice)])


def test_rejected_requests_do_not_count_against_the_limit(alice: Any, admin_user: Any) -> None:
    CreditPolicy.objects.update_or_create(pk=1, defaults={"emergency_max_uses": 1})
    request = ask(alice, [waiting_job(alice)])
    approvals.emergency_decide(request_id=request.pk, decided_by=admin_user, approve=False)
    assert approvals.emergency_uses_left(alice) == 1


def test_members_cannot_approve_emergencies(alice: Any, bob: Any) -> None:
    request = ask(alice, [waiting_job(alice)])
    with pytest.raises(approvals.StaffOnly):
        approvals.emergency_decide(request_id=request.pk, decided_by=bob, approve=True)


def test_every_request_and_decision_is_kept_for_audit(alice: Any, admin_user: Any) -> None:
    request = ask(alice, [waiting_job(alice)], hours=1)
    approvals.emergency_decide(
        request_id=request.pk, decided_by=admin_user, approve=True, comment="ok"
    )
    with time_machine.travel(timezone.now() + timedelta(hours=2)):
        approvals.emergencies_expire()
    request.refresh_from_db()
    assert (request.state, request.decided_by, request.comment) == ("expired", admin_user, "ok")
    from django.contrib.admin.sites import site

    from approvals import admin as admin_approvals  # noqa: F401 - registers the admin

    assert not site._registry[EmergencyRequest].has_delete_permission(None)  # type: ignore[arg-type]


def test_staff_decide_grants_and_emergencies_from_the_django_admin(
    client: Any, alice: Any, admin_user: Any
) -> None:
    from django.urls import reverse

    grant = apply(alice)
    emergency = approvals.emergency_request_create(
        user=alice, job_ids=[waiting_job(alice).pk], reason=REASON, hours=6
    )
    client.force_login(admin_user)
    client.post(
        reverse("admin:jobqueue_prioritygrant_changelist"),
        {"action": "approve", "_selected_action": [grant.pk]},
    )
    client.post(
        reverse("admin:jobqueue_emergencyrequest_changelist"),
        {"action": "reject", "_selected_action": [emergency.pk]},
    )
    grant.refresh_from_db()
    emergency.refresh_from_db()
    assert grant.state == PriorityGrant.State.APPROVED and grant.decided_by == admin_user
    assert emergency.state == EmergencyRequest.State.REJECTED
    assert emergency.comment == "Rejected in the admin."
    assert Notification.objects.filter(user=alice).count() >= 2


def test_members_cannot_reach_the_approval_admin(client: Any, alice: Any, charlie: Any) -> None:
    from django.urls import reverse

    grant = apply(alice)
    client.force_login(charlie)
    response = client.post(
        reverse("admin:jobqueue_prioritygrant_changelist"),
        {"action": "approve", "_selected_action": [grant.pk]},
    )
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    grant.refresh_from_db()
    assert grant.state == PriorityGrant.State.PENDING


@pytest.mark.parametrize(
    ("language", "deadline"),
    [("en", "2026-03-09 18:00 CST"), ("zh-hans", "2026年3月9日 18:00 CST")],
)
def test_the_approval_notification_gives_the_deadline_with_its_time_zone(
    alice: Any, admin_user: Any, settings: Any, language: str, deadline: str
) -> None:
    from datetime import UTC, datetime

    settings.TIME_ZONE = "Asia/Shanghai"
    alice.preferred_language = language
    alice.save()
    with time_machine.travel(datetime(2026, 3, 2, tzinfo=UTC)):
        grant = approvals.grant_apply(
            user=alice,
            reason=REASON,
            deadline=datetime(2026, 3, 9, 10, 0, tzinfo=UTC),
            gpus_expected=1,
        )
        approvals.grant_decide(grant_id=grant.pk, decided_by=admin_user, approve=True)
    note = Notification.objects.get(user=alice, kind="grant_approved")
    # Read in an email, a bare "18:00" says nothing about where the lab is.
    assert deadline in note.body

"""The audit log of the lab's rules: a lab admin's change in the admin is recorded with who,
when and the old and new values; so is an approval decision, in the admin or through the
API; lab admins read the log and cannot change it; members never see it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine
from asgiref.sync import async_to_sync
from auditlog.models import LogEntry
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.test import AsyncClient, Client
from django.utils import timezone

from accounts.models import CreditPolicy
from core.duration_fields import format_duration
from jobqueue.models import JobTemplate, PriorityGrant, Queue, SchedulingPolicy
from tests.admin_forms import admin_change
from tests.conftest import api_as
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

LOG = "/admin/auditlog/logentry/"
NOON = datetime(2026, 3, 4, 12, 0, tzinfo=UTC)


def lab_admin(*permissions: str) -> Any:
    """Dora: staff, not a superuser, with only the admin permissions named."""
    dora = UserFactory.create(username="dora", is_staff=True)
    for name in permissions:
        app_label, codename = name.split(".")
        dora.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return dora


def entries_for(obj: Any) -> list[Any]:
    return list(
        LogEntry.objects.filter(
            content_type=ContentType.objects.get_for_model(type(obj)), object_pk=str(obj.pk)
        ).order_by("timestamp", "pk")
    )


def a_pending_grant(member: Any) -> PriorityGrant:
    return PriorityGrant.objects.create(
        user=member,
        queue=Queue.objects.get(name="high"),
        reason="Experiments for the camera-ready",
        deadline=timezone.now() + timedelta(days=5),
    )


def test_a_lab_admins_change_of_a_queue_time_limit_is_logged_with_who_when_and_old_and_new(
    client: Client, queues: Any
) -> None:
    dora = lab_admin("jobqueue.view_queue", "jobqueue.change_queue")
    debug = Queue.objects.get(name="debug")
    old = debug.max_time_limit_s
    assert old != 12 * 3600
    client.force_login(dora)

    with time_machine.travel(NOON, tick=False):
        admin_change(client, f"/admin/jobqueue/queue/{debug.pk}/change/", max_time_limit_s="12h")

    [entry] = entries_for(debug)
    assert entry.action == LogEntry.Action.UPDATE
    assert entry.actor == dora
    assert entry.timestamp == NOON
    assert entry.changes_dict == {"max_time_limit_s": [str(old), str(12 * 3600)]}
    # Dora, no superuser, reads it in the admin's log: who, and the values as the form writes them.
    page = client.get(LOG)
    assert page.status_code == 200
    html = page.content.decode()
    assert "dora" in html and f"Max time limit: {format_duration(old)} → 12h" in html
    assert "2026-03-04 12:00:00" in html


def test_the_log_is_in_chinese_for_chinese_readers(client: Client, queues: Any) -> None:
    dora = lab_admin("jobqueue.view_queue", "jobqueue.change_queue")
    client.force_login(dora)
    debug = Queue.objects.get(name="debug")
    admin_change(client, f"/admin/jobqueue/queue/{debug.pk}/change/", requires_grant="on")

    html = client.get(LOG, HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()

    assert "审计日志" in html and "操作人" in html and "旧值 → 新值" in html
    assert "需要已批准的高优先级资格：否 → 是" in html


def test_an_added_queue_shows_its_values_not_the_rows_that_point_at_it(client: Client) -> None:
    Queue.objects.create(
        name="extra", title="Extra", max_time_limit_s=7200, default_time_limit_s=3600
    )
    client.force_login(lab_admin())
    entry = LogEntry.objects.get()

    listing = client.get(LOG).content.decode()
    page = client.get(f"{LOG}{entry.pk}/change/").content.decode()

    assert '<td class="field-action_label">added</td>' in listing
    assert "<tr><td>Max time limit</td><td>—</td><td>2h</td></tr>" in page
    for where in (listing, page):
        assert "Allowances" not in where and "CategoryQueueAllowance" not in where


def test_a_lab_admin_reads_an_entry_but_cannot_change_add_or_delete_one(
    client: Client, queues: Any
) -> None:
    dora = lab_admin("jobqueue.view_queue", "jobqueue.change_queue")
    client.force_login(dora)
    debug = Queue.objects.get(name="debug")
    admin_change(client, f"/admin/jobqueue/queue/{debug.pk}/change/", max_gpus_per_job="3")
    [entry] = entries_for(debug)

    page = client.get(f"{LOG}{entry.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Old and new values" in html and "<td>Max GPUs per job</td>" in html
    assert 'name="_save"' not in html  # a view, not a form
    assert client.post(f"{LOG}{entry.pk}/change/", {}).status_code == 403
    assert client.get(f"{LOG}add/").status_code == 403
    assert client.post(f"{LOG}{entry.pk}/delete/", {"post": "yes"}).status_code == 403
    assert LogEntry.objects.filter(pk=entry.pk).exists()


def test_an_approval_decided_in_the_admin_is_logged_with_the_admin_who_decided(
    client: Client, alice: Any, queues: Any
) -> None:
    grant = a_pending_grant(alice)
    dora = lab_admin("jobqueue.view_prioritygrant", "jobqueue.change_prioritygrant")
    client.force_login(dora)

    response = client.post(
        "/admin/jobqueue/prioritygrant/", {"action": "approve", "_selected_action": [grant.pk]}
    )

    assert response.status_code == 302
    created, decided = entries_for(grant)
    assert created.action == LogEntry.Action.CREATE and created.actor is None
    assert decided.action == LogEntry.Action.UPDATE and decided.actor == dora
    assert decided.changes_dict["state"] == ["pending", "approved"]
    assert decided.changes_dict["decided_by"] == ["None", "dora"]


def test_served_over_asgi_as_in_production_a_decision_is_logged_with_its_actor(
    alice: Any, queues: Any
) -> None:
    grant = a_pending_grant(alice)
    dora = lab_admin("jobqueue.view_prioritygrant", "jobqueue.change_prioritygrant")
    client = AsyncClient()

    async def approve() -> Any:
        await client.aforce_login(dora)
        return await client.post(
            "/admin/jobqueue/prioritygrant/", {"action": "approve", "_selected_action": [grant.pk]}
        )

    assert async_to_sync(approve)().status_code == 302
    decided = entries_for(grant)[-1]
    assert decided.actor == dora and decided.changes_dict["state"] == ["pending", "approved"]


def test_an_approval_decided_through_the_api_with_a_token_is_logged_with_the_tokens_owner(
    alice: Any, queues: Any
) -> None:
    grant = a_pending_grant(alice)
    dora = lab_admin()

    response = api_as(dora).post(f"/api/v1/grants/{grant.pk}/reject/", {"comment": "not now"})

    assert response.status_code == 200, response.content
    decided = entries_for(grant)[-1]
    # The token is checked inside the view, after the middleware ran.
    assert decided.actor == dora
    assert decided.changes_dict["state"] == ["pending", "rejected"]


def test_a_member_sees_neither_the_log_nor_an_entry(
    client: Client, alice: Any, queues: Any
) -> None:
    dora = lab_admin("jobqueue.view_queue", "jobqueue.change_queue")
    admin = Client()
    admin.force_login(dora)
    debug = Queue.objects.get(name="debug")
    admin_change(admin, f"/admin/jobqueue/queue/{debug.pk}/change/", max_gpus_per_job="3")
    [entry] = entries_for(debug)

    client.force_login(alice)
    for url in (LOG, f"{LOG}{entry.pk}/change/"):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_a_one_row_policy_made_with_its_defaults_is_no_change_but_editing_it_is(
    client: Client,
) -> None:
    policy = SchedulingPolicy.current()
    credits = CreditPolicy.current()
    assert entries_for(policy) == [] and entries_for(credits) == []

    dora = lab_admin("jobqueue.view_schedulingpolicy", "jobqueue.change_schedulingpolicy")
    client.force_login(dora)
    admin_change(client, f"/admin/jobqueue/schedulingpolicy/{policy.pk}/change/", weight_age="42")

    [entry] = entries_for(policy)
    assert entry.actor == dora and entry.changes_dict["weight_age"] == ["2000.0", "42.0"]


def test_lab_wide_job_templates_are_logged_and_members_own_are_not(alice: Any) -> None:
    own = JobTemplate.objects.create(name="mine", owner=alice, fields={"gpus": 1})
    own.fields = {"gpus": 2}
    own.save()
    lab_wide = JobTemplate.objects.create(name="hello-gpu", fields={"gpus": 1})

    assert entries_for(own) == []
    assert [e.action for e in entries_for(lab_wide)] == [LogEntry.Action.CREATE]

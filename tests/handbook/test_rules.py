"""The rules page reads the live settings, shows what an admin changed and when, and takes
members' suggestions to the admins."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from accounts.models import CreditPolicy, Notification
from core.audit_log import audit_log_url
from handbook.models import RuleSuggestion
from jobqueue.models import Queue
from tests.admin_forms import admin_change

pytestmark = pytest.mark.django_db


def test_the_rules_page_needs_a_login(client: Client) -> None:
    assert client.get("/rules/").status_code == 302


def test_the_rules_page_reads_queues_categories_and_credits_from_the_settings(
    client: Client, alice: Any, queues: Any
) -> None:
    policy = CreditPolicy.current()
    policy.base_grant = 1234
    policy.emergency_max_uses = 3
    policy.save()
    client.force_login(alice)
    html = client.get("/rules/").content.decode()
    debug = Queue.objects.get(name="debug")
    assert f"A job may ask for up to {debug.max_gpus_per_job} GPU" in html
    assert "monthly grant of 1234 credits" in html
    assert "Each member may have 3 approved emergency requests" in html
    assert alice.category.name in html
    # 1234 × the PhD category's multiplier, in the category table.
    assert str(int(1234 * alice.category.credit_multiplier)) in html


def test_the_rules_page_shows_a_setting_an_admin_changed_and_when(
    client: Client, admin_user: Any, alice: Any, queues: Any
) -> None:
    debug = Queue.objects.get(name="debug")
    member = Client()
    member.force_login(alice)
    before = member.get("/rules/").content.decode()
    assert "A job may ask for up to 3 GPUs." not in before.split('id="categories"')[0]

    client.force_login(admin_user)
    admin_change(client, f"/admin/jobqueue/queue/{debug.pk}/change/", max_gpus_per_job="3")

    after = member.get("/rules/").content.decode()
    queues_section = after.split('id="categories"')[0]
    debug_part = queues_section.split("<code>debug</code>")[1].split("<h3>")[0]
    assert "A job may ask for up to 3 GPUs." in debug_part
    assert "Changed " in debug_part  # the admin log's time of the change
    assert "Last change:" in after


def lab_admin_with(*codenames: str) -> Any:
    """Dora: staff, not a superuser, allowed what the codenames say in the admin."""
    from django.contrib.auth.models import Permission

    from tests.factories import UserFactory

    dora = UserFactory.create(username="dora", is_staff=True)
    dora.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return dora


def test_staff_follow_each_changed_date_to_the_audit_log_of_that_rule(
    client: Client, alice: Any, queues: Any
) -> None:
    from jobqueue.models import CategoryQueueAllowance

    dora = lab_admin_with("view_queue", "change_queue", "view_creditpolicy", "change_creditpolicy")
    client.force_login(dora)
    debug = Queue.objects.get(name="debug")
    assert debug.max_gpus_per_job != 3
    admin_change(client, f"/admin/jobqueue/queue/{debug.pk}/change/", max_gpus_per_job="3")
    policy = CreditPolicy.current()
    admin_change(client, f"/admin/accounts/creditpolicy/{policy.pk}/change/", base_grant="1234")

    html = client.get("/rules/").content.decode()
    queue_log = audit_log_url(Queue, CategoryQueueAllowance)
    credits_log = audit_log_url(CreditPolicy)
    debug_part = html.split("<code>debug</code>")[1].split("<h3>")[0]
    assert f'<a href="{queue_log}" data-testid="rules-changed-link">Changed ' in debug_part
    credits_part = html.split('id="credits"')[1].split("</section>")[0]
    assert f'<a href="{credits_log}" data-testid="rules-changed-link">Changed ' in credits_part
    assert f'<a href="{audit_log_url()}" data-testid="rules-change-log">' in html

    # Each link shows that rule's changes, and only those.
    queue_changes = client.get(queue_log).content.decode()
    assert f"Max GPUs per job: {debug.max_gpus_per_job} → 3" in queue_changes
    assert "1234" not in queue_changes
    credit_changes = client.get(credits_log).content.decode()
    assert "1234" in credit_changes and "Max GPUs per job" not in credit_changes

    # Members see when a rule changed, never the log.
    member = Client()
    member.force_login(alice)
    theirs = member.get("/rules/").content.decode()
    assert "Changed " in theirs.split("<code>debug</code>")[1].split("<h3>")[0]
    assert "/admin/auditlog/" not in theirs and "rules-change-log" not in theirs


def test_a_rule_changed_outside_the_admin_shows_when_it_changed(
    client: Client, alice: Any, queues: Any
) -> None:
    from jobqueue.models import SchedulingPolicy

    client.force_login(alice)
    policy = SchedulingPolicy.current()
    before = client.get("/rules/").content.decode()
    assert "Changed " not in before.split('id="time-limits"')[1].split("</section>")[0]

    policy.stop_grace_s = 60  # as a what-if replay's "apply" does, through no admin form
    policy.save()

    after = client.get("/rules/").content.decode()
    assert "Changed " in after.split('id="time-limits"')[1].split("</section>")[0]


def test_the_rules_page_shows_the_priority_weights_the_pass_uses(
    client: Client, admin_user: Any, alice: Any, queues: Any
) -> None:
    from jobqueue.models import SchedulingPolicy

    policy = SchedulingPolicy.current()
    client.force_login(admin_user)
    admin_change(
        client,
        f"/admin/jobqueue/schedulingpolicy/{policy.pk}/change/",
        weight_attained="2500",
        attained_thresholds="2, 4, 8",
        weight_short="0",
    )
    member = Client()
    member.force_login(alice)
    html = member.get("/rules/").content.decode()
    part = html.split('id="priority"')[1].split("</section>")[0]
    rows = {
        cells[0]: cells[1]
        for cells in (
            [c.split(">", 1)[1].strip() for c in row.split("</td>")[:2]]
            for row in part.split("<tr>")[2:]
        )
    }
    assert rows["GPUs held now"] == "2500"
    assert rows["Short time limit"] == "0"
    assert rows["Fair share"] == "10000"
    assert "it steps down at 2, 4, 8 GPUs" in part
    zh = member.get("/rules/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "谁先运行" in zh and "当前占用的 GPU" in zh and "回填" in zh


def test_the_rules_page_is_in_chinese_for_chinese_readers(
    client: Client, alice: Any, queues: Any
) -> None:
    client.force_login(alice)
    html = client.get("/rules/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "使用规则" in html and "紧急通道" in html and "每月基础积分" in html


def test_a_member_suggests_a_change_and_every_admin_is_told(
    client: Client, alice: Any, admin_user: Any, charlie: Any, queues: Any
) -> None:
    client.force_login(alice)
    response = client.post(
        "/rules/", {"topic": "debug time limit", "text": "Two hours would fit a full epoch."}
    )
    assert response.status_code == 302
    suggestion = RuleSuggestion.objects.get()
    assert (suggestion.author, suggestion.state) == (alice, RuleSuggestion.State.OPEN)
    notes = Notification.objects.filter(kind="rule_suggestion")
    assert [n.user for n in notes] == [admin_user]
    assert "debug time limit" in notes[0].body

    # Staff read it in the admin; members (charlie) cannot.
    outsider = Client()
    outsider.force_login(charlie)
    assert outsider.get(notes[0].url).status_code == 302
    staff = Client()
    staff.force_login(admin_user)
    assert "Two hours would fit a full epoch." in staff.get(notes[0].url).content.decode()


def test_an_empty_suggestion_is_refused_with_the_reason(client: Client, alice: Any) -> None:
    client.force_login(alice)
    response = client.post("/rules/", {"topic": "", "text": ""})
    assert response.status_code == 400
    assert "This field is required." in response.content.decode()
    assert not RuleSuggestion.objects.exists()


def test_in_slurm_mode_each_rule_says_how_slurm_enforces_it_or_that_it_does_not(
    client: Client, alice: Any, queues: Any, settings: Any
) -> None:
    from jobqueue.models import CategoryQueueAllowance

    CategoryQueueAllowance.objects.create(
        category=alice.category, queue=Queue.objects.get(name="debug"), max_gpu_hours_per_week=10
    )
    client.force_login(alice)
    agents = client.get("/rules/").content.decode()
    assert "In Slurm" not in agents  # the portal's own engine: no Slurm notes

    settings.LABPORTAL_EXECUTOR = "slurm"
    html = client.get("/rules/").content.decode()
    debug = html.split("<code>debug</code>")[1].split("<h3>")[0]
    assert "MaxJobsPerUser" in debug and "MaxWall" in debug
    assert "Slurm gives each job whole GPUs" in debug  # debug's shared slots do not carry over
    assert "Slurm does not enforce the running-jobs and running-GPUs limits" in debug
    high = html.split("<code>high</code>")[1].split("<h3>")[0]
    assert "only while your grant is in force" in high
    categories = html.split('id="categories"')[1].split("</section>")[0]
    assert "GrpTRES=gres/gpu" in categories
    assert (
        "Slurm does not enforce the queued-jobs limit: the portal refuses at submit" in categories
    )
    time_limits = html.split('id="time-limits"')[1].split("</section>")[0]
    assert "KillWait" in time_limits and "seconds later it is stopped" not in time_limits
    zh = client.get("/rules/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "Slurm 不强制执行排队作业数上限" in zh

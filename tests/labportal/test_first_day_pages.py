"""Page defects a new member met: error pages, branding, sign-up, approvals, emails, language."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core import mail
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone, translation

from accounts.models import LedgerEntry
from accounts.services import ledger_post, notify
from jobqueue.models import PriorityGrant, Queue

pytestmark = pytest.mark.django_db


def zh(client: Client) -> None:
    client.post(reverse("set_language"), {"language": "zh-hans", "next": "/"})


@pytest.mark.parametrize("debug", [True, False])
def test_a_missing_page_is_the_portals_404_in_its_layout_in_both_languages(
    client: Client, alice: Any, debug: bool
) -> None:
    client.force_login(alice)
    with override_settings(DEBUG=debug):
        response = client.get("/no/such/page/")
        assert response.status_code == 404
        html = response.content.decode()
        assert "Page not found" in html and 'class="mainnav"' in html
        assert "URLconf" not in html and "urlpatterns" not in html
        zh(client)
        html = client.get("/no/such/page/").content.decode()
        assert "页面不存在" in html and "返回仪表盘" in html


def test_a_member_refused_a_staff_page_reads_why_in_the_layout(client: Client, alice: Any) -> None:
    client.force_login(alice)
    response = client.get(reverse("approvals"))
    assert response.status_code == 403
    html = response.content.decode()
    assert "Only lab admins can decide on requests." in html
    assert 'class="mainnav"' in html
    zh(client)
    assert "只有实验室管理员可以处理请求。" in client.get(reverse("approvals")).content.decode()


def test_the_500_page_renders_without_a_request() -> None:
    from django.template import loader

    with translation.override("en"):
        html = loader.get_template("500.html").render({})
    assert "Something went wrong" in html and "LabPortal" in html


def test_the_favicon_and_the_admin_are_branded(client: Client, admin_user: Any) -> None:
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response["Location"].endswith("favicon.svg")
    client.force_login(admin_user)
    html = client.get("/admin/").content.decode()
    assert "LabPortal administration" in html
    assert "Django administration" not in html


def test_the_login_page_offers_sign_up_only_when_it_is_open(client: Client) -> None:
    with override_settings(LABPORTAL_SIGNUP_MODE="closed"):
        html = client.get(reverse("account_login")).content.decode()
        assert reverse("account_signup") not in html
        assert "ask one for yours" in html
    with override_settings(LABPORTAL_SIGNUP_MODE="approval"):
        assert reverse("account_signup") in client.get(reverse("account_login")).content.decode()


def test_staff_see_how_many_requests_wait_and_empty_tables_say_so(
    client: Client, alice: Any, admin_user: Any, queues: Any
) -> None:
    client.force_login(admin_user)
    html = client.get(reverse("approvals")).content.decode()
    assert 'class="navcount"' not in html
    assert html.count("No decisions yet.") == 2
    PriorityGrant.objects.create(
        user=alice,
        queue=Queue.objects.get(name="high"),
        reason="ICML",
        deadline=timezone.now() + timedelta(days=3),
    )
    html = client.get(reverse("dashboard")).content.decode()
    assert '<span class="navcount"' in html and ">1</span>" in html
    client.force_login(alice)
    assert 'class="navcount"' not in client.get(reverse("dashboard")).content.decode()


def test_the_tokens_page_shows_the_authorization_header_as_text(client: Client, alice: Any) -> None:
    client.force_login(alice)
    html = client.get(reverse("token_list")).content.decode()
    assert '<code data-testid="bearer-example">Authorization: Bearer lp_…</code>' in html


def test_grant_form_errors_appear_once(client: Client, alice: Any, queues: Any) -> None:
    client.force_login(alice)
    html = client.post(
        reverse("grant_apply"),
        {"reason": "ok", "deadline": "2001-01-01T10:00", "gpus_expected": 1},
    ).content.decode()
    assert html.count("Say in a sentence why you need the high queue") == 1


@override_settings(LABPORTAL_SITE_URL="https://gpu.lab.example.org")
def test_emails_carry_absolute_links_on_the_site_url(
    alice: Any, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        notify(user=alice, kind="test", title="Hi", body="Look", url="/account/credits/")
    assert "https://gpu.lab.example.org/account/credits/" in mail.outbox[0].body


def test_switching_language_is_remembered_for_later_notifications(
    client: Client, alice: Any
) -> None:
    client.force_login(alice)
    zh(client)
    alice.refresh_from_db()
    assert alice.preferred_language == "zh-hans"


def test_a_ledger_note_reads_in_the_readers_language(client: Client, alice: Any) -> None:
    with translation.override("zh-hans"):  # posted while someone browsed in Chinese
        from django.utils.translation import gettext_noop

        ledger_post(
            user=alice,
            amount=Decimal("-1"),
            kind=LedgerEntry.Kind.REFUND,
            idempotency_key="t1",
            note=gettext_noop("Cancelled booking refunded"),
            note_params={},
        )
    entry = LedgerEntry.objects.get(idempotency_key="t1")
    assert entry.note == "Cancelled booking refunded"
    client.force_login(alice)
    assert "Cancelled booking refunded" in client.get(reverse("credits")).content.decode()
    zh(client)
    assert "已取消的预约已退款" in client.get(reverse("credits")).content.decode()

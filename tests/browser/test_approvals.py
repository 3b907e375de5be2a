"""In a real browser: alice applies for a priority grant, the admin approves it, alice sees it approved."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.urls import include, path
from django.utils import timezone

from accounts.selectors import unread_notification_count
from jobqueue.models import PriorityGrant, Queue
from labportal.urls import urlpatterns as portal_urlpatterns
from tests.browser.conftest import log_in
from tests.conftest import PASSWORD

# Until the includes are merged into jobqueue/urls.py, mount the approval pages here.
urlpatterns = [path("jobs/", include("approvals.urls")), *portal_urlpatterns]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls(__name__),
]


def log_out(page: Any) -> None:
    page.context.clear_cookies()


def test_alice_applies_for_a_grant_the_admin_approves_it_and_alice_sees_it_approved(
    page: Any, live_server: Any, alice: Any, admin_user: Any
) -> None:
    # A transactional test before this one may have flushed the migration-made queues.
    Queue.objects.get_or_create(
        name="high", defaults={"title": "High priority", "tier": 0, "requires_grant": True}
    )
    # What the admin has unread before (their first month's credits, when they joined).
    unread_before = unread_notification_count(admin_user)
    log_in(page, live_server, "alice", PASSWORD)
    page.wait_for_selector("[data-testid=username]")
    page.goto(f"{live_server.url}/jobs/grants/apply/")
    page.fill("textarea[name=reason]", "Final experiments for the thesis defence")
    deadline = (timezone.localtime() + timedelta(days=10)).strftime("%Y-%m-%dT%H:%M")
    page.fill("input[name=deadline]", deadline)
    page.fill("input[name=gpus_expected]", "4")
    page.click("[data-testid=grant-form] button[type=submit]")
    page.wait_for_selector("[data-testid=my-grants] >> text=pending")
    grant = PriorityGrant.objects.get(user=alice)

    log_out(page)
    log_in(page, live_server, "admin", PASSWORD)
    page.wait_for_selector("[data-testid=username]")
    bell = page.locator("[data-testid=bell-count]").inner_text()
    assert int(bell) == unread_before + 1  # "alice applies …"
    page.click("[data-testid=nav-staff] summary")  # the staff menu holds Approvals
    page.click("[data-testid=nav-approvals]")
    row = page.locator(f"tr[data-grant='{grant.pk}']")
    row.locator("input[name=comment]").fill("Good luck with the defence")
    row.locator("[data-testid=approve]").click()
    page.wait_for_selector(f"tr[data-grant='{grant.pk}'] [data-testid=grant-state]")
    assert "approved" in page.locator(f"tr[data-grant='{grant.pk}']").inner_text()

    log_out(page)
    log_in(page, live_server, "alice", PASSWORD)
    page.wait_for_selector("[data-testid=bell-count]")
    page.goto(f"{live_server.url}/jobs/grants/apply/")
    state = page.locator(
        f"[data-testid=my-grants] tr[data-grant='{grant.pk}'] [data-testid=grant-state]"
    )
    assert state.inner_text() == "approved"
    assert "Good luck with the defence" in page.inner_text("[data-testid=my-grants]")
    page.click("[data-testid=bell]")
    assert "is approved" in page.inner_text("[data-testid=notifications]")

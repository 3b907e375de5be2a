"""The pages work under the Content-Security-Policy: Chromium refuses nothing they use.

The policy allows only the portal's own scripts and styles (plus style attributes,
which the calendar's bars use); htmx runs without its inline indicator style and
without eval. Chromium reports every refused script, style or frame on the console.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from tests.browser.conftest import log_in
from tests.conftest import PASSWORD
from tests.factories import GpuFactory, NodeFactory, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

MEMBER_PAGES = [
    "/",
    "/gpus/",
    "/jobs/",
    "/jobs/submit/",
    "/jobs/queue/",
    "/reservations/",
    "/reservations/mine/",
    "/reservations/suggest/",
    "/account/credits/",
    "/account/notifications/",
    "/account/tokens/",
    "/jobs/grants/apply/",
    "/jobs/emergencies/apply/",
]
STAFF_PAGES = ["/jobs/approvals/", "/admin/", "/admin/jobqueue/job/", "/api/docs/"]


def refusals(page: Any) -> list[str]:
    messages: list[str] = []
    page.on(
        "console",
        lambda message: (
            messages.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )
    return messages


def test_no_page_breaks_the_content_security_policy(
    page: Any, live_server: Any, alice: Any
) -> None:
    node = NodeFactory(name="gpu01")
    for index in range(2):
        GpuFactory(node=node, index=index, model="NVIDIA H200")
    refused = refusals(page)
    log_in(page, live_server, "alice", PASSWORD)
    page.wait_for_selector("[data-testid=username]")
    for path in MEMBER_PAGES:
        response = page.goto(f"{live_server.url}{path}")
        assert response.status == 200, path
        assert "script-src 'self'" in response.headers["content-security-policy"]
        page.wait_for_load_state("networkidle")
    assert refused == []
    # htmx runs under the policy: the suggestion form swaps its answer in.
    day = (timezone.localdate() + timedelta(days=2)).isoformat()
    page.goto(f"{live_server.url}/reservations/?date={day}")
    page.wait_for_load_state("networkidle")
    assert page.evaluate("() => window.htmx.config.allowEval") is False
    form = page.locator("[data-testid=suggest-form]")
    form.locator("input[name=hours]").fill("1")
    form.locator("button[type=submit]").click()
    page.locator("#suggest-result [data-testid=suggest-result]").wait_for()
    assert refused == []


def test_the_admin_and_the_api_docs_work_under_the_policy(page: Any, live_server: Any) -> None:
    UserFactory(username="root", is_staff=True, is_superuser=True)
    refused = refusals(page)
    log_in(page, live_server, "root", PASSWORD)
    page.wait_for_selector("[data-testid=username]")
    for path in STAFF_PAGES:
        response = page.goto(f"{live_server.url}{path}")
        assert response.status == 200, path
        page.wait_for_load_state("networkidle")
    page.wait_for_selector(".swagger-ui .opblock", timeout=30000)
    assert refused == []

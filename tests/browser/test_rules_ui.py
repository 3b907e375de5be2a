"""In a real browser, in English and Chinese, at laptop and phone width: a member finds the
rules' forms (the high-queue refusal and the rules page lead to the grant form, which they
can open), reads their own alerts, and staff filter alerts by state (no inline handler:
the page fixture fails on any Content-Security-Policy refusal).

Set LABPORTAL_SCREENSHOTS=/some/dir to keep a screenshot of every page visited."""

from __future__ import annotations

import os
from typing import Any

import pytest

from alerts.models import Alert
from jobqueue.models import CategoryQueueAllowance, EmergencyRequest, Job, Queue
from tests.browser.conftest import log_in
from tests.browser.test_alerts import alerting_lab  # noqa: F401 (a fixture)
from tests.browser.test_first_day import LAPTOP, PHONE, new_page, screenshot, switch_language
from tests.conftest import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTHS = {"laptop": LAPTOP, "phone": PHONE}


@pytest.mark.parametrize("width", ["laptop", "phone"])
@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_a_member_is_led_from_the_high_queue_refusal_and_the_rules_to_the_grant_form(
    open_context: Any,
    live_server: Any,
    alerting_lab: Any,  # noqa: F811
    image: Any,
    language: str,
    width: str,
) -> None:
    CategoryQueueAllowance.objects.create(
        category=alerting_lab["job"].owner.category,
        queue=Queue.objects.get(name="debug"),
        max_running_jobs_per_user=4,
        max_gpu_hours_per_week=20,
    )
    page = new_page(open_context, WIDTHS[width])
    log_in(page, live_server, "alice", PASSWORD)
    page.wait_for_selector("[data-testid=username]")
    if language != "en":
        switch_language(page, language)
    tag = f"{language}-{WIDTHS[width]['width']}"

    page.goto(f"{live_server.url}/jobs/submit/?queue=high&command=python%20train.py")
    page.click("[data-testid=submit]")
    page.wait_for_selector("[data-testid=grant-apply-link]")
    screenshot(page, f"submit-high-refused-{tag}")
    page.click("[data-testid=grant-apply-link]")
    page.wait_for_selector("[data-testid=grant-form]")
    assert page.url.endswith("/jobs/grants/apply/")

    response = page.goto(f"{live_server.url}/rules/")
    assert response.status == 200
    screenshot(page, f"rules-{tag}")
    preemption = page.locator("[data-testid=rules-preemption]")
    preemption.scroll_into_view_if_needed()
    assert preemption.is_visible()
    assert ("12 小时" if language != "en" else "12 hours") in preemption.inner_text()
    if os.environ.get("LABPORTAL_SCREENSHOTS"):
        folder = os.environ["LABPORTAL_SCREENSHOTS"]
        page.locator("[data-testid=rules-credits]").screenshot(
            path=f"{folder}/rules-credits-{tag}.png"
        )
    allowances = page.inner_text("[data-testid=rules-allowances-debug]")
    assert "4" in allowances and "20" in allowances
    for link, form in (("rules-grant-link", "grant-form"), ("rules-emergency-link", "")):
        href = page.get_attribute(f"[data-testid={link}]", "href")
        assert href and "/jobs/approvals/" not in href
        opened = page.goto(f"{live_server.url}{href}")
        assert opened.status == 200, href
        if form:
            page.wait_for_selector(f"[data-testid={form}]")
        page.go_back()

    response = page.goto(f"{live_server.url}/alerts/")
    assert response.status == 200
    screenshot(page, f"alerts-member-{tag}")
    note = page.inner_text("[data-testid=member-alerts-note]")
    assert ("告警" in note) if language != "en" else ("your jobs" in note)
    idle = alerting_lab["idle"]
    assert page.is_visible(f"[data-testid=alert-{idle.pk}]")
    assert page.locator(f"[data-testid=ack-{idle.pk}]").count() == 0
    # Alerts about GPUs no job of hers uses are not hers to see.
    others = Alert.objects.exclude(job__owner__username="alice").exclude(user__username="alice")
    assert others.exists()
    for alert in others:
        assert page.locator(f"[data-testid=alert-{alert.pk}]").count() == 0


@pytest.mark.parametrize("width", ["laptop", "phone"])
@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_staff_filter_alerts_by_state_and_see_each_emergency_jobs_state(
    open_context: Any,
    live_server: Any,
    alerting_lab: Any,  # noqa: F811
    language: str,
    width: str,
) -> None:
    idle = alerting_lab["idle"]
    Alert.objects.filter(pk=idle.pk).update(state=Alert.State.ACKNOWLEDGED)
    job = alerting_lab["job"]
    ended = Job.objects.create(
        owner=job.owner,
        queue=job.queue,
        image=job.image,
        command=["python", "t.py"],
        time_limit_s=3600,
        state=Job.State.CANCELLED,
    )
    emergency = EmergencyRequest.objects.create(user=job.owner, reason="deadline", hours=4)
    emergency.jobs.add(ended)
    page = new_page(open_context, WIDTHS[width])
    log_in(page, live_server, "admin", PASSWORD)
    page.wait_for_selector("[data-testid=username]")
    if language != "en":
        switch_language(page, language)
    tag = f"{language}-{WIDTHS[width]['width']}"

    page.goto(f"{live_server.url}/alerts/")
    firing = Alert.objects.filter(state=Alert.State.FIRING).first()
    assert firing is not None and page.is_visible(f"[data-testid=alert-{firing.pk}]")
    page.select_option("[data-testid=alert-state-filter]", "acknowledged")
    page.wait_for_url("**/alerts/?state=acknowledged")
    screenshot(page, f"alerts-staff-acknowledged-{tag}")
    assert page.is_visible(f"[data-testid=alert-{idle.pk}]")
    assert page.locator(f"[data-testid=alert-{firing.pk}]").count() == 0

    page.goto(f"{live_server.url}/jobs/approvals/")
    screenshot(page, f"approvals-{tag}")
    state = page.inner_text(
        f"tr[data-emergency='{emergency.pk}'] [data-testid=emergency-job-state]"
    )
    assert state == ("已取消" if language != "en" else "cancelled")
    row = page.locator(f"tr[data-emergency='{emergency.pk}']")
    row.locator("[data-testid=approve]").click()
    error = page.inner_text(f"tr[data-emergency='{emergency.pk}'] [data-testid=decision-error]")
    assert ("已结束" in error) if language != "en" else ("already ended" in error)
    emergency.refresh_from_db()
    assert emergency.state == EmergencyRequest.State.PENDING

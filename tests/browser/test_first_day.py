"""The portal as a new member meets it, in a real browser: phone and laptop widths, English
and Chinese, confirmations, readable links and the error pages.

Set LABPORTAL_SCREENSHOTS=/some/dir to keep a screenshot of every page visited.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from accounts.services import notify
from cluster.models import Node
from jobqueue.models import Job, PriorityGrant, Queue
from jobqueue.submit import job_submit
from reservations.services import reservation_create
from scheduling.passes import scheduling_pass
from tests.browser.conftest import log_in
from tests.browser.test_jobs import agent_event
from tests.conftest import PASSWORD
from tests.factories import make_cluster

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}
LAPTOP = {"width": 1366, "height": 768}

MEMBER_PAGES = [
    "/",
    "/gpus/",
    "/jobs/queue/",
    "/jobs/",
    "/jobs/submit/",
    "/reservations/?view=week",
    "/reservations/mine/",
    "/account/credits/",
    "/account/notifications/",
    "/account/tokens/",
    "/jobs/grants/apply/",
    "/jobs/emergencies/apply/",
]
STAFF_PAGES = ["/jobs/approvals/"]


def screenshot(page: Any, name: str) -> None:
    folder = os.environ.get("LABPORTAL_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


def slug(path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-") or "dashboard"


def overflow_px(page: Any) -> int:
    """How far the page runs past the viewport sideways (0 when nothing does)."""
    return int(
        page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    )


def new_page(open_context: Any, viewport: dict[str, int], language: str = "en") -> Any:
    context = open_context(viewport=viewport)
    page = context.new_page()
    page.set_default_timeout(15000)
    return page


def switch_language(page: Any, language: str) -> None:
    # The select submits itself from portal.js: a change before the page's scripts ran
    # (a busy machine) would change nothing.
    page.wait_for_load_state("load")
    page.select_option("select[name=language]", language)
    page.wait_for_selector(f"html[lang='{language}']")


@pytest.fixture
def lab(alice: Any, bob: Any, admin_user: Any, queues: Any, image: Any) -> dict[str, Any]:
    """A lab with work in it: a running job, a waiting one, bookings, a notification, a request."""
    make_cluster(nodes=2, gpus_per_node=4)
    running = job_submit(
        owner=bob,
        queue="normal",
        image=image.reference,
        command="python train.py --epochs 100 --name a-rather-long-experiment-name",
        gpus=8 // 2,
        time_limit_s=4 * 3600,
    )
    scheduling_pass()
    agent_event(running, "started")
    mine = job_submit(
        owner=alice,
        queue="normal",
        image=image.reference,
        command="sleep 20; echo done",
        gpus=4,
        time_limit_s=5400,
    )
    start = timezone.now().replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    reservation_create(
        user=bob,
        start=start,
        end=start + timedelta(hours=3),
        gpu_count=1,
        node=Node.objects.get(name="gpu02"),
        note="ablation runs",
    )
    notify(user=alice, kind="test", title="Your credits are running low", url="/account/credits/")
    PriorityGrant.objects.create(
        user=alice,
        queue=Queue.objects.get(name="high"),
        reason="ICML deadline",
        deadline=timezone.now() + timedelta(days=5),
    )
    return {"running": running, "mine": mine}


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_the_main_pages_fit_a_phone_screen(
    open_context: Any, live_server: Any, lab: Any, language: str
) -> None:
    page = new_page(open_context, PHONE)
    log_in(page, live_server, "admin", PASSWORD)
    if language != "en":
        switch_language(page, language)
    too_wide = {}
    for path in MEMBER_PAGES + STAFF_PAGES:
        page.goto(f"{live_server.url}{path}")
        screenshot(page, f"phone-{language}-{slug(path)}")
        if overflow_px(page) > 0:
            too_wide[path] = overflow_px(page)
    assert too_wide == {}
    # The navigation is behind a menu button, and the button opens it.
    page.goto(f"{live_server.url}/")
    assert not page.is_visible("nav.mainnav")
    page.click("[data-testid=menu-toggle]")
    assert page.is_visible("nav.mainnav")
    screenshot(page, f"phone-{language}-menu-open")


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_at_1366_px_the_header_is_one_row_and_the_week_calendar_fits(
    open_context: Any, live_server: Any, lab: Any, language: str
) -> None:
    page = new_page(open_context, LAPTOP)
    log_in(page, live_server, "admin", PASSWORD)
    if language != "en":
        switch_language(page, language)
    for path in MEMBER_PAGES + STAFF_PAGES:
        page.goto(f"{live_server.url}{path}")
        screenshot(page, f"laptop-{language}-{slug(path)}")
        assert overflow_px(page) == 0, path
    page.goto(f"{live_server.url}/")
    # One row: every link of the bar (the staff menu included) sits on the same line.
    tops = page.evaluate(
        "Array.from(document.querySelectorAll("
        "'.topbar .brand, .mainnav > a, .mainnav > details > summary, .usermenu .credits,"
        " .usermenu summary')).map(e => Math.round(e.getBoundingClientRect().top))"
    )
    assert len(tops) >= 12 and max(tops) - min(tops) <= 6, tops
    # The staff links and the account's links open from their menus.
    page.click("[data-testid=nav-staff] summary")
    assert page.is_visible("[data-testid=nav-approvals]")
    page.click("[data-testid=account-menu] summary")
    page.click("[data-testid=account-menu] button[type=submit]")
    page.wait_for_url(re.compile(r".*/accounts/log(in|out)/.*|.*/$"))
    page.goto(f"{live_server.url}/jobs/")
    assert "/accounts/login/" in page.url
    log_in(page, live_server, "admin", PASSWORD)
    page.goto(f"{live_server.url}/reservations/?view=week")
    # Friday to Sunday are on screen: the grid needs no sideways scroll.
    widths = page.evaluate(
        "(() => { const m = document.querySelector('.cal-scroll');"
        " return [m.scrollWidth, m.clientWidth]; })()"
    )
    assert widths[0] <= widths[1]
    # Others' bookings say whose they are, with the note.
    assert "ablation runs" in page.inner_text("[data-testid=calendar]")


def test_gpu_names_stay_in_view_when_the_calendar_scrolls(
    open_context: Any, live_server: Any, lab: Any
) -> None:
    page = new_page(open_context, {"width": 900, "height": 800})
    log_in(page, live_server, "alice", PASSWORD)
    page.goto(f"{live_server.url}/reservations/?view=week")
    label = page.locator("[data-testid='gpu-row-gpu01/gpu0'] .cal-label")
    before = label.bounding_box()
    page.evaluate("document.querySelector('.cal-scroll').scrollLeft = 400")
    after = label.bounding_box()
    assert abs(after["x"] - before["x"]) < 2


def _contrast(page: Any, selector: str) -> float:
    return float(
        page.evaluate(
            """(sel) => {
              const el = document.querySelector(sel);
              const rgb = (c) => c.match(/\\d+(\\.\\d+)?/g).slice(0, 3).map(Number);
              const lum = ([r, g, b]) => {
                const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
                return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
              };
              let bg = el, color = getComputedStyle(el).color, back;
              while (bg) {
                back = getComputedStyle(bg).backgroundColor;
                if (back && !back.startsWith('rgba(0, 0, 0, 0)') && back !== 'transparent') break;
                bg = bg.parentElement;
              }
              const [a, b] = [lum(rgb(color)), lum(rgb(back || 'rgb(255,255,255)'))];
              return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
            }""",
            selector,
        )
    )


def test_links_on_light_backgrounds_are_readable(
    open_context: Any, live_server: Any, lab: Any
) -> None:
    page = new_page(open_context, LAPTOP)
    log_in(page, live_server, "alice", PASSWORD)
    page.goto(f"{live_server.url}/account/notifications/")
    assert _contrast(page, "[data-testid=notifications] button.link") >= 4.5
    page.goto(f"{live_server.url}/jobs/grants/apply/")
    assert _contrast(page, "[data-testid=my-grants] button.link") >= 4.5


def test_the_tokens_page_shows_the_header_to_send(
    open_context: Any, live_server: Any, alice: Any
) -> None:
    page = new_page(open_context, LAPTOP)
    log_in(page, live_server, "alice", PASSWORD)
    page.goto(f"{live_server.url}/account/tokens/")
    assert page.inner_text("[data-testid=bearer-example]") == "Authorization: Bearer lp_…"


def test_cancelling_a_running_job_asks_first(open_context: Any, live_server: Any, lab: Any) -> None:
    page = new_page(open_context, LAPTOP)
    log_in(page, live_server, "bob", PASSWORD)
    running = lab["running"]
    page.goto(f"{live_server.url}/jobs/{running.pk}/")
    questions: list[str] = []

    def refuse(dialog: Any) -> None:
        questions.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", refuse)
    page.click("[data-testid=cancel]")
    page.wait_for_timeout(300)
    assert questions and "unsaved work is lost" in questions[0]
    running.refresh_from_db()
    assert running.stop_requested_at is None
    # Hours and minutes, not seconds.
    assert "4 h" in page.inner_text("dl.facts") and "14400" not in page.content()


def test_draining_asks_first_and_then_explains_itself(
    open_context: Any, live_server: Any, lab: Any
) -> None:
    page = new_page(open_context, LAPTOP)
    log_in(page, live_server, "admin", PASSWORD)
    page.goto(f"{live_server.url}/gpus/")
    questions = []

    def answer(dialog: Any) -> None:
        questions.append(dialog.message)
        dialog.accept()

    page.on("dialog", answer)
    page.click("section[data-node=gpu02] [data-testid=drain]")
    page.wait_for_selector("section[data-node=gpu02] [data-testid=drain-note]")
    assert questions and "gpu02" in questions[0]
    states = page.locator("section[data-node=gpu02] tbody tr td:last-child").all_inner_texts()
    assert states and "available" not in states


def test_a_grant_form_error_is_shown_once(open_context: Any, live_server: Any, lab: Any) -> None:
    page = new_page(open_context, LAPTOP)
    log_in(page, live_server, "bob", PASSWORD)
    page.goto(f"{live_server.url}/jobs/grants/apply/")
    page.fill(
        "[data-testid=grant-form] [name=reason]", "My thesis defence is next month; I need 4 GPUs."
    )
    page.fill("[data-testid=grant-form] [name=deadline]", "2001-01-01T10:00")
    page.click("[data-testid=grant-form] button[type=submit]")
    page.wait_for_selector("[data-testid=form-error]")
    assert page.content().count("The deadline must be in the future.") == 1


def test_a_new_members_job_page_in_chinese(open_context: Any, live_server: Any, lab: Any) -> None:
    page = new_page(open_context, PHONE)
    log_in(page, live_server, "alice", PASSWORD)
    switch_language(page, "zh-hans")
    job: Job = lab["mine"]
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    screenshot(page, "phone-zh-hans-job-detail")
    text = page.inner_text("main")
    assert "正在调度" in text  # being scheduled, not "unknown"
    assert "已提交到 normal 队列。" in text  # the stored event, in the reader's language
    assert "sleep 20; echo done" in text  # the command as typed
    assert "1 小时 30 分钟" in text
    for english in ("Submitted to", "submitted", "No output yet."):
        assert english not in text


@pytest.mark.parametrize(
    ("language", "title"), [("en", "Page not found"), ("zh-hans", "页面不存在")]
)
def test_error_pages_are_in_the_layout_and_the_readers_language(
    open_context: Any, live_server: Any, alice: Any, language: str, title: str
) -> None:
    page = new_page(open_context, LAPTOP)
    log_in(page, live_server, "alice", PASSWORD)
    if language != "en":
        switch_language(page, language)
    response = page.goto(f"{live_server.url}/no/such/page/")
    assert response.status == 404
    assert page.inner_text("[data-testid=error-page] h1") == title
    assert page.locator("nav.mainnav").count() == 1  # the site's layout
    assert "URLconf" not in page.content()
    screenshot(page, f"laptop-{language}-404")
    response = page.goto(f"{live_server.url}/jobs/approvals/")
    assert response.status == 403
    assert page.locator("[data-testid=error-page]").count() == 1
    screenshot(page, f"laptop-{language}-403")


def test_the_login_page_offers_no_sign_up_while_sign_up_is_closed(
    open_context: Any, live_server: Any, db: Any
) -> None:
    page = new_page(open_context, PHONE)
    page.goto(f"{live_server.url}/accounts/login/")
    screenshot(page, "phone-en-login")
    assert page.locator("a[href*=signup]").count() == 0
    assert "ask one for yours" in page.inner_text("main")
    favicon = page.request.get(f"{live_server.url}/favicon.ico")
    assert favicon.ok and "svg" in favicon.headers["content-type"]

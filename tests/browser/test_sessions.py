"""A member starts a session from the web and watches its page; the terminal page of a running job.
Set LABPORTAL_SCREENS_DIR to keep screenshots (English and Chinese, 1366 and 390 px wide)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from jobqueue.models import Job
from tests.browser.conftest import log_in
from tests.browser.test_alerts import shot, use_language
from tests.conftest import PASSWORD
from tests.sessions.conftest import running_session

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("language", ["en", "zh-hans"])
@pytest.mark.parametrize("width", [1366, 390])
def test_a_member_starts_a_session_and_sees_it_wait(
    page: Any, live_server: Any, cluster: Any, alice: Any, image: Any, language: str, width: int
) -> None:
    page.set_viewport_size({"width": width, "height": 900})
    use_language(page, live_server, language)
    log_in(page, live_server, alice.username, PASSWORD)
    page.goto(f"{live_server.url}/sessions/new/")
    shot(page, f"session-new-{language}-{width}")
    page.get_by_test_id("session-start").click()
    expect(page.get_by_test_id("session-state")).to_be_visible()
    job = Job.objects.get(owner=alice)
    assert job.kind == Job.Kind.JUPYTER and page.url.endswith(f"/jobs/{job.pk}/session/")
    shot(page, f"session-waiting-{language}-{width}")
    page.goto(f"{live_server.url}/sessions/")
    expect(page.get_by_test_id("session-list")).to_contain_text(f"#{job.pk}")
    shot(page, f"session-list-{language}-{width}")
    running = running_session(alice, image, kind="terminal", gateway="http://127.0.0.1:9")
    page.goto(f"{live_server.url}/jobs/{running.pk}/")
    page.get_by_test_id("job-terminal").click()
    # xterm.js is loaded and dials the WebSocket; the test's live server is not ASGI, so it
    # closes (tests/sessions/test_proxy.py relays the terminal through the ASGI app).
    expect(page.get_by_test_id("terminal")).to_have_attribute("data-closed", re.compile(r"^\d+$"))
    expect(page.locator(".xterm")).to_be_visible()
    shot(page, f"terminal-{language}-{width}")

"""The browser tests' page and sign-in; the browser itself is tests/conftest.py's (one per
pytest process: Playwright's sync API cannot start twice in one thread).

Every page a browser test opens is watched for Content-Security-Policy refusals (the
document's ``securitypolicyviolation`` events and Chromium's console reports): one fails
the test, as a refused inline handler or style silently breaks what it was for."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.signals import request_finished, request_started

# Runs in every document before its own scripts: each refusal goes to the test.
REPORT_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (event) => {
  window.__labportalCspViolation(
    `${event.violatedDirective} refused ${event.blockedURI || "inline"} at ` +
    `${event.sourceFile || document.location.href}:${event.lineNumber}`
  );
});
"""


class _InFlight:
    """Requests the live server is still answering. A closed browser leaves its last
    request (an htmx poll, a page's first read of a one-row policy) running in the server's
    thread; flushing the database under it fails on SQLite ("database table is locked")."""

    def __init__(self) -> None:
        self.count = 0
        self.last_change = time.monotonic()
        self.lock = threading.Lock()

    def started(self, **_: Any) -> None:
        with self.lock:
            self.count += 1
            self.last_change = time.monotonic()

    def finished(self, **_: Any) -> None:
        with self.lock:
            self.count = max(0, self.count - 1)
            self.last_change = time.monotonic()

    def drain(self, timeout_s: float = 10.0, quiet_s: float = 0.3) -> None:
        """Wait (bounded) until the server has answered every request it took and has
        taken none for `quiet_s`: a request the browser sent just before it closed can
        reach the server's thread after the count last read zero."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                idle = self.count == 0 and time.monotonic() - self.last_change >= quiet_s
            if idle:
                return
            time.sleep(0.02)


IN_FLIGHT = _InFlight()
request_started.connect(IN_FLIGHT.started, dispatch_uid="tests.browser.in_flight.started")
request_finished.connect(IN_FLIGHT.finished, dispatch_uid="tests.browser.in_flight.finished")


def watch_content_security_policy(context: Any) -> list[str]:
    """The refusals of every page `context` opens, from now on (a list that fills up)."""
    refused: list[str] = []
    context.expose_binding(
        "__labportalCspViolation",
        lambda source, text: refused.append(f"{source['page'].url}: {text}"),
    )
    context.add_init_script(REPORT_VIOLATIONS)

    def on_console(message: Any) -> None:
        if "Content Security Policy" in message.text:
            refused.append(message.text)

    context.on("console", on_console)
    return refused


@pytest.fixture
def page(browser: Any, transactional_db: Any) -> Iterator[Any]:
    # Opened after the test's database and closed before it is flushed: a page that still
    # polls (the job page's live log, htmx) must not query tables the teardown empties
    # (on SQLite: "database table is locked" in the next test's setup).
    context = browser.new_context(locale="en-US")
    refused = watch_content_security_policy(context)
    page = context.new_page()
    page.set_default_timeout(15000)
    yield page
    context.close()
    IN_FLIGHT.drain()
    assert refused == [], f"the Content-Security-Policy refused: {refused}"


@pytest.fixture
def open_context(browser: Any, transactional_db: Any) -> Iterator[Callable[..., Any]]:
    """Opens browser contexts (a viewport, say) watched as `page` is; closed and checked
    at the test's end."""
    opened: list[tuple[Any, list[str]]] = []

    def open_one(**options: Any) -> Any:
        context = browser.new_context(**{"locale": "en-US", **options})
        opened.append((context, watch_content_security_policy(context)))
        return context

    yield open_one
    refused = []
    for context, found in opened:
        context.close()
        refused += found
    IN_FLIGHT.drain()
    assert refused == [], f"the Content-Security-Policy refused: {refused}"


def log_in(page: Any, live_server: Any, username: str, password: str) -> None:
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("input[name=login]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")

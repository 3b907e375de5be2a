"""The browser tests' page and sign-in; the browser itself is tests/conftest.py's (one per
pytest process: Playwright's sync API cannot start twice in one thread)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def page(browser: Any, transactional_db: Any) -> Iterator[Any]:
    # Opened after the test's database and closed before it is flushed: a page that still
    # polls (the job page's live log, htmx) must not query tables the teardown empties
    # (on SQLite: "database table is locked" in the next test's setup).
    context = browser.new_context(locale="en-US")
    page = context.new_page()
    page.set_default_timeout(15000)
    yield page
    context.close()


def log_in(page: Any, live_server: Any, username: str, password: str) -> None:
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("input[name=login]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")

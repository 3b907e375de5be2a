"""Playwright in headless Debian Chromium (Playwright's own browser download is not used)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import require_in_ci

CHROMIUM = os.environ.get("LABPORTAL_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not shutil.which(CHROMIUM):
        require_in_ci(f"Chromium at {CHROMIUM} (apt-get install chromium)")
    # Playwright's sync API runs an event loop in this thread; the Django ORM calls
    # the tests make around it are still synchronous and safe.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        yield browser
        browser.close()


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

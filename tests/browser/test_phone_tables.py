"""At phone width the queue and the GPUs tables show every column: each row is a card with
each value under its column's name, nothing pushed off the right edge (where "Estimated
start", "Why it waits" and who uses a GPU used to hide). Both languages.

Set LABPORTAL_SCREENSHOTS=/some/dir to keep a screenshot of every page visited."""

from __future__ import annotations

from typing import Any

import pytest

from jobqueue.models import Allocation
from jobqueue.submit import job_submit
from tests.browser.conftest import log_in
from tests.browser.test_first_day import PHONE, new_page, screenshot, switch_language
from tests.cluster.conftest import job_on
from tests.conftest import PASSWORD
from tests.factories import GpuFactory, NodeFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
LABELS = {
    "en": ("Estimated start", "Why it waits", "In use by"),
    "zh-hans": ("预计开始时间", "等待原因", "使用者"),
}


def on_screen(page: Any, selector: str) -> dict[str, float]:
    box = page.locator(selector).first.bounding_box()
    assert box is not None, selector
    assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"] + 0.5, (selector, box)
    return dict(box)


def label_of(page: Any, selector: str) -> str:
    return str(
        page.locator(selector).first.evaluate(
            "cell => getComputedStyle(cell, '::before').content.replace(/^\"|\"$/g, '')"
        )
    )


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_the_queue_and_gpus_tables_show_every_column_on_a_phone(
    open_context: Any, live_server: Any, alice: Any, queues: Any, image: Any, language: str
) -> None:
    node = NodeFactory.create(name="gpu01", state="up")
    busy = GpuFactory.create(node=node, index=0, uuid="GPU-aaa")
    GpuFactory.create(node=node, index=1, uuid="GPU-bbb")
    Allocation.objects.create(job=job_on(node, alice, name="resnet-sweep"), gpu=busy)
    # Both GPUs, while one is busy: it waits, and says why.
    waiting = job_submit(
        owner=alice, queue="normal", image=image.reference, command="train", gpus=2
    )

    page = new_page(open_context, PHONE)
    log_in(page, live_server, alice.username, PASSWORD)
    page.wait_for_selector("[data-testid=username]")
    if language != "en":
        switch_language(page, language)
    estimated, why, users = LABELS[language]

    page.goto(f"{live_server.url}/jobs/queue/")
    row = f'[data-testid=waiting] tr[data-job="{waiting.pk}"]'
    page.wait_for_selector(row)
    screenshot(page, f"queue-phone-{language}")
    cells = page.locator(f"{row} td")
    assert cells.count() == 7
    last = f"{row} td:nth-child(7)"
    assert label_of(page, last) == why
    assert page.inner_text(last).strip()  # the reason itself, readable
    on_screen(page, last)
    assert label_of(page, f"{row} td:nth-child(6)") == estimated
    on_screen(page, f"{row} td:nth-child(6)")
    # The page itself never scrolls sideways.
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]

    page.goto(f"{live_server.url}/gpus/")
    cell = 'tr[data-gpu="GPU-aaa"] td.users'
    page.wait_for_selector(cell)
    screenshot(page, f"gpus-phone-{language}")
    assert label_of(page, cell) == users
    assert "resnet-sweep" in page.inner_text(cell)
    on_screen(page, cell)
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_the_calendar_on_a_phone_has_tappable_cells_and_opens_at_the_current_time(
    open_context: Any, live_server: Any, alice: Any, queues: Any, language: str
) -> None:
    node = NodeFactory.create(name="gpu01", state="up")
    GpuFactory.create(node=node, index=0, uuid="GPU-aaa")

    page = new_page(open_context, PHONE)
    log_in(page, live_server, alice.username, PASSWORD)
    page.wait_for_selector("[data-testid=username]")
    if language != "en":
        switch_language(page, language)
    page.goto(f"{live_server.url}/reservations/")
    page.wait_for_selector("[data-testid=calendar] .cal-now")
    screenshot(page, f"calendar-phone-{language}")
    # A half hour is a cell a finger can hit (it was 13 px).
    cell = page.locator("[data-testid='gpu-row-gpu01/gpu0'] .cal-cell").first.bounding_box()
    assert cell is not None and cell["width"] >= 24, cell
    # The grid opens at the current time: the "now" line is on screen, beside the GPU names.
    now = page.locator("[data-testid='gpu-row-gpu01/gpu0'] .cal-now").bounding_box()
    label = page.locator("[data-testid='gpu-row-gpu01/gpu0'] .cal-label").bounding_box()
    assert now is not None and label is not None
    assert label["x"] + label["width"] <= now["x"] <= PHONE["width"], (now, label)
    # Only the grid scrolls sideways, never the page.
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]

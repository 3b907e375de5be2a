"""The guided first job in a browser, in both languages and at laptop and phone width: a new
member reaches it from the home page, submits the Hello GPU template, and each step is
ticked only once done (the page fixture also fails on any Content-Security-Policy refusal)."""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from jobqueue.models import Job
from reservations.services import reservation_create
from tests.browser.conftest import log_in
from tests.browser.test_first_day import (
    LAPTOP,
    PHONE,
    new_page,
    overflow_px,
    screenshot,
    switch_language,
)
from tests.conftest import PASSWORD
from tests.factories import make_cluster

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTHS = {"laptop": LAPTOP, "phone": PHONE}


def ticked(page: Any) -> list[str]:
    return page.eval_on_selector_all(
        "[data-testid=tutorial-steps] li[data-done=true]", "items => items.map(i => i.dataset.step)"
    )


@pytest.mark.parametrize("width", ["laptop", "phone"])
@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_a_new_member_walks_the_guided_first_job_and_each_step_ticks_after_it_is_done(
    open_context: Any,
    live_server: Any,
    alice: Any,
    queues: Any,
    image: Any,
    language: str,
    width: str,
) -> None:
    (node,) = make_cluster(nodes=1, gpus_per_node=2)
    call_command("seed_hello_gpu", image=image.reference, stdout=io.StringIO())
    page = new_page(open_context, WIDTHS[width])
    log_in(page, live_server, "alice", PASSWORD)
    page.wait_for_selector("[data-testid=username]")
    if language != "en":
        switch_language(page, language)
    tag = f"{language}-{WIDTHS[width]['width']}"

    page.goto(f"{live_server.url}/")
    page.click("[data-testid=checklist-tutorial-link]")
    page.wait_for_selector("[data-testid=tutorial-steps]")
    assert ticked(page) == []
    assert overflow_px(page) == 0
    screenshot(page, f"tutorial-start-{tag}")

    page.click("[data-testid=tutorial-link-submit]")
    assert "GPUs given to this job" in page.input_value("[name=command]")
    page.click("[data-testid=submit-form] button[type=submit]")
    page.wait_for_selector("[data-testid=job-state]")  # the job's page: watched
    job = Job.objects.get(owner=alice)
    page.goto(f"{live_server.url}/help/tutorial/")
    assert ticked(page) == ["submit", "watch"]

    Job.objects.filter(pk=job.pk).update(state=Job.State.COMPLETED, ended_at=timezone.now())
    page.click("[data-testid=tutorial-link-logs]")
    page.wait_for_selector("[data-testid=job-state]")
    start = (timezone.now() + timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
    reservation_create(
        user=alice, node=node, gpu_count=1, start=start, end=start + timedelta(hours=1)
    )
    page.goto(f"{live_server.url}/help/tutorial/")
    assert ticked(page) == ["submit", "watch", "logs", "booking"]
    page.click("[data-testid=tutorial-link-credits]")
    page.wait_for_load_state()
    page.goto(f"{live_server.url}/help/tutorial/")
    assert ticked(page) == ["submit", "watch", "logs", "booking", "credits"]
    assert page.locator("[data-testid=tutorial-complete]").is_visible()
    assert overflow_px(page) == 0
    screenshot(page, f"tutorial-done-{tag}")

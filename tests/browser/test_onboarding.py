"""A new member's first login shows the first-steps checklist; each step is ticked as it is done."""

from __future__ import annotations

from typing import Any

import pytest

from jobqueue.models import Job
from tests.browser.conftest import log_in
from tests.conftest import PASSWORD
from tests.factories import make_cluster

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_new_member_submits_the_first_debug_job_from_the_checklist_and_it_is_ticked(
    page: Any, live_server: Any, alice: Any, queues: Any, image: Any
) -> None:
    make_cluster(nodes=1, gpus_per_node=1)
    log_in(page, live_server, "alice", PASSWORD)
    page.goto(f"{live_server.url}/")
    checklist = page.locator("[data-testid=onboarding-checklist]")
    assert checklist.is_visible()
    assert checklist.locator("li.done").count() == 0

    checklist.locator("[data-item=debug_job] a").click()
    # The form arrives with the debug queue and a harmless first command.
    assert page.input_value("select[name=queue]") == "debug"
    assert page.input_value("[name=command]") == "nvidia-smi"
    page.click("[data-testid=submit-form] button[type=submit]")
    page.wait_for_selector("[data-testid=job-state]")
    assert Job.objects.get(owner=alice).queue.name == "debug"

    page.goto(f"{live_server.url}/")
    assert checklist.locator("[data-item=debug_job].done").count() == 1
    assert checklist.locator("li.done").count() == 1

    # Reading the rules ticks its item; putting the list away hides it for good.
    page.goto(f"{live_server.url}/rules/")
    page.goto(f"{live_server.url}/")
    assert checklist.locator("[data-item=rules].done").count() == 1
    checklist.locator("button[type=submit]").click()
    page.wait_for_load_state()
    assert page.locator("[data-testid=onboarding-checklist]").count() == 0

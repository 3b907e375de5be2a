"""The job page's live log: it follows new output, pauses, searches and filters."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from joblogs.services import job_log_append
from tests.browser.conftest import log_in
from tests.browser.test_alerts import shot, use_language
from tests.cluster.conftest import job_on
from tests.conftest import PASSWORD
from tests.factories import make_cluster

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_the_owner_follows_searches_and_filters_the_live_log(
    page: Any, live_server: Any, alice: Any, queues: Any, language: str
) -> None:
    node = make_cluster(nodes=1, gpus_per_node=1)[0]
    job = job_on(node, alice)
    lines = b"".join(f"epoch {i} loss {1 / (i + 1):.4f}\n".encode() for i in range(200))
    job_log_append(job_id=job.pk, stream="c1", offset=0, data=lines)
    use_language(page, live_server, language)
    log_in(page, live_server, "alice", PASSWORD)
    page.wait_for_selector("[data-testid=username]")
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    log = page.locator("[data-testid=job-log] [data-testid=log]")
    expect(log).to_contain_text("epoch 199 loss")
    # New output appears while following.
    job_log_append(job_id=job.pk, stream="c1", offset=len(lines), data=b"validation ok\n")
    expect(log).to_contain_text("validation ok")
    page.fill("[data-testid=log-search]", "epoch 19")
    expect(log.locator("mark").first).to_have_text("epoch 19")
    page.check("[data-testid=log-filter]")
    expect(log).not_to_contain_text("epoch 5 loss")
    assert log.inner_text().count("\n") <= 11
    follow = page.locator("[data-testid=log-follow]")
    follow.click()
    expect(follow).to_have_attribute("aria-pressed", "false")
    page.set_viewport_size({"width": 1366, "height": 900})
    shot(page, f"job-log-{language}-1366")
    page.set_viewport_size({"width": 390, "height": 844})
    shot(page, f"job-log-{language}-390")
    href = page.locator("[data-testid=log-download]").get_attribute("href")
    assert href == f"/api/v1/jobs/{job.pk}/log/download/"

"""A member submits a job in the browser, sees its place in the queue, then sees it complete.

The agent's side is played by calling the same control services its messages reach
(tests/e2e runs the real agent and worker processes)."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from jobqueue.models import Job
from jobqueue.submit import job_submit
from scheduling.agent_events import job_event_apply
from scheduling.passes import scheduling_pass
from tests.browser.conftest import log_in
from tests.conftest import PASSWORD
from tests.factories import make_cluster

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def agent_event(job: Job, kind: str, **extra: Any) -> None:
    job.refresh_from_db()
    assert job.node is not None
    job_event_apply(
        node_name=job.node.name,
        event={
            "event_id": f"{job.pk}:{kind}:c{job.pk}",
            "job_id": job.pk,
            "kind": kind,
            "container_id": f"c{job.pk}",
            "ts": timezone.now().timestamp(),
            "log_tail": extra.pop("log_tail", ""),
            "reason": "",
            "exit_code": None,
            **extra,
        },
    )


def test_a_member_submits_a_job_sees_its_place_and_then_its_completion(
    page: Any, live_server: Any, alice: Any, bob: Any, queues: Any, image: Any
) -> None:
    make_cluster(nodes=1, gpus_per_node=1)
    blocker = job_submit(
        owner=bob,
        queue="normal",
        image=image.reference,
        command="python long.py",
        time_limit_s=3600,
    )
    scheduling_pass()
    agent_event(blocker, "started")

    log_in(page, live_server, "alice", PASSWORD)
    page.goto(f"{live_server.url}/jobs/submit/")
    page.select_option("select[name=queue]", "normal")
    page.fill("[name=command]", "python train.py --epochs 1")
    page.fill("input[name=time_limit_hours]", "1")
    page.click("[data-testid=submit-form] button[type=submit]")
    page.wait_for_selector("[data-testid=job-state]")
    job = Job.objects.get(owner=alice)
    assert page.inner_text("[data-testid=job-state]") == "pending"

    scheduling_pass()
    page.reload()
    position = page.inner_text("[data-testid=job-position]")
    assert "Place in the queue: 1" in position
    assert "Waiting for GPUs to free up." in position
    page.goto(f"{live_server.url}/jobs/queue/")
    assert page.locator(f"[data-testid=waiting] tr[data-job='{job.pk}']").count() == 1

    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    agent_event(blocker, "exited", exit_code=0)
    scheduling_pass()
    agent_event(job, "started")
    agent_event(job, "exited", exit_code=0, log_tail="epoch 1 done\n")
    # The job page refreshes itself (htmx): no reload. (A string predicate for
    # wait_for_function would need eval, which the Content-Security-Policy refuses.)
    expect(page.locator("[data-testid=job-state]")).to_have_text("completed", timeout=15000)
    assert "epoch 1 done" in page.inner_text("[data-testid=log]")
    assert page.locator("[data-testid=cancel]").count() == 0

"""The GPUs page and a finished job's page draw their charts (uPlot) with data from the API."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from cluster.models import Gpu
from jobqueue.models import Allocation, Job
from telemetry.models import GpuMinuteRollup
from tests.browser.conftest import log_in
from tests.cluster.conftest import job_on
from tests.conftest import PASSWORD
from tests.factories import GpuFactory, NodeFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def drawn_points(page: Any, testid: str) -> int:
    selector = f"[data-testid=chart-{testid}]"
    page.wait_for_selector(f"{selector}[data-points]")
    points = int(page.get_attribute(selector, "data-points"))
    # uPlot draws on a canvas; an empty period says so in words instead.
    assert page.locator(f"{selector} canvas").count() == (1 if points else 0)
    return points


def test_the_gpus_page_and_a_finished_jobs_page_show_charts_with_data(
    page: Any, live_server: Any, alice: Any
) -> None:
    node = NodeFactory.create(name="gpu01")
    gpus = [GpuFactory.create(node=node, index=i, uuid=f"GPU-{i}") for i in range(2)]
    now = timezone.now().replace(second=0, microsecond=0)
    job = job_on(node, alice, name="resnet-sweep", state="completed")
    Job.objects.filter(pk=job.pk).update(
        started_at=now - timedelta(minutes=50), ended_at=now - timedelta(minutes=10)
    )
    Allocation.objects.create(job=job, gpu=gpus[0], active=False, released_at=now)
    GpuMinuteRollup.objects.bulk_create(
        GpuMinuteRollup(
            gpu=gpu,
            bucket=now - timedelta(minutes=m),
            samples=12,
            util_mean=(80.0 if gpu.index == 0 else 5.0) + m % 7,
            util_max=99.0,
            mem_used_max_mb=30000,
            job=job if gpu.index == 0 and 10 <= m <= 50 else None,
        )
        for gpu in Gpu.objects.all()
        for m in range(1, 60)
    )

    log_in(page, live_server, "alice", PASSWORD)
    page.goto(f"{live_server.url}/gpus/")
    # An hour of minutes in 4-minute bins (a day in at most 400 points), two GPUs.
    assert drawn_points(page, "gpu-util") >= 28
    assert drawn_points(page, "node-memory") >= 14
    page.click("text=7 days")
    assert drawn_points(page, "node-util") == 0  # no hourly rollups yet: an honest empty chart
    assert "No readings in this period yet" in page.inner_text("[data-testid=chart-node-util]")

    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    assert drawn_points(page, "job-util") >= 40
    assert drawn_points(page, "job-memory") >= 40

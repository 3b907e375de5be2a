"""The GPUs page for staff, as a browser shows it at both widths and in both languages: a
GPU running a job reads "in use", and the Grafana deep links (LABPORTAL_GRAFANA_URL) open
each node's and each GPU's dashboard. The page fixture fails on any CSP refusal.

Set LABPORTAL_SCREENSHOTS=/some/dir to keep a screenshot of every page visited."""

from __future__ import annotations

from typing import Any

import pytest

from jobqueue.models import Allocation
from tests.browser.conftest import log_in
from tests.browser.test_first_day import LAPTOP, PHONE, new_page, screenshot, switch_language
from tests.cluster.conftest import job_on
from tests.conftest import PASSWORD
from tests.factories import GpuFactory, NodeFactory, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("width", [LAPTOP, PHONE], ids=["laptop", "phone"])
@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_staff_see_gpus_in_use_and_open_grafana_from_them(
    open_context: Any, live_server: Any, alice: Any, settings: Any, language: str, width: Any
) -> None:
    settings.LABPORTAL_GRAFANA_URL = "https://grafana.lab.example.org"
    node = NodeFactory.create(name="gpu01", state="up", gpu_backend="nvml", runtime="docker")
    busy = GpuFactory.create(node=node, index=0, uuid="GPU-aaa", model="NVIDIA H100 80GB HBM3")
    GpuFactory(node=node, index=1, uuid="GPU-bbb", model="NVIDIA H100 80GB HBM3")
    Allocation.objects.create(job=job_on(node, alice, name="resnet-sweep"), gpu=busy)
    UserFactory(username="staffer", is_staff=True, is_superuser=True)

    page = new_page(open_context, width)
    log_in(page, live_server, "staffer", PASSWORD)
    page.wait_for_selector("[data-testid=username]")
    if language != "en":
        switch_language(page, language)
    page.goto(f"{live_server.url}/gpus/")
    page.wait_for_selector("[data-testid=grafana-node]")
    screenshot(page, f"gpus-staff-{language}-{width['width']}")

    in_use = page.inner_text('tr[data-gpu="GPU-aaa"] [data-testid=gpu-in-use]')
    assert in_use == ("in use" if language == "en" else "使用中")
    assert page.locator('tr[data-gpu="GPU-bbb"] [data-testid=gpu-in-use]').count() == 0
    assert page.get_attribute("[data-testid=grafana-node]", "href") == (
        "https://grafana.lab.example.org/d/labportal-node/?var-node=gpu01"
    )
    assert page.get_attribute('tr[data-gpu="GPU-aaa"] [data-testid=grafana-gpu]', "href") == (
        "https://grafana.lab.example.org/d/labportal-gpu/?var-node=gpu01&var-uuid=GPU-aaa"
    )

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import log_in
from tests.conftest import PASSWORD
from tests.factories import GpuFactory, NodeFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_member_logs_in_sees_the_dashboard_and_switches_to_chinese(
    page: Any, live_server: Any, alice: Any
) -> None:
    node = NodeFactory(name="gpu01")
    GpuFactory(node=node, index=0, model="NVIDIA H200")
    log_in(page, live_server, "alice", PASSWORD)
    page.wait_for_selector("[data-testid=my-jobs]")
    assert page.inner_text("[data-testid=username]") == "alice"
    page.click("nav >> text=GPUs")
    page.wait_for_selector("text=GPU servers")
    assert "NVIDIA H200" in page.content()
    page.wait_for_load_state("load")  # portal.js submits the select once it has run
    page.select_option("select[name=language]", "zh-hans")
    page.wait_for_selector("text=GPU 服务器")
    assert page.get_attribute("html", "lang") == "zh-hans"
    assert "仪表盘" in page.inner_text("nav")

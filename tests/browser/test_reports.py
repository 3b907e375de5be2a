"""Staff open the usage report, change the period, download CSV and PDF; a member sees only their line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reports.models import ReportTask
from reports.services import report_task_run
from tests.browser.conftest import log_in
from tests.conftest import PASSWORD
from tests.reports.conftest import week  # noqa: F401  (fixture)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
QUERY = "period=custom&from=2026-03-02&to=2026-03-08"


def test_staff_change_the_period_and_download_csv_and_pdf(
    page: Any,
    live_server: Any,
    week: Any,  # noqa: F811
    admin_user: Any,
    tmp_path: Path,
) -> None:
    log_in(page, live_server, "admin", PASSWORD)
    page.wait_for_selector("[data-testid=username]")
    page.goto(f"{live_server.url}/reports/?period=custom&from=2026-01-01&to=2026-01-31")
    assert page.locator("[data-testid=total-gpu-hours]").inner_text() == "0.0"
    form = page.locator("[data-testid=period-form]")
    form.locator("select[name=period]").select_option("month")
    form.locator("input[name=at]").fill("2026-03-04")
    form.locator("button[type=submit]").click()
    page.wait_for_url("**period=month**")
    assert page.locator("[data-testid=total-gpu-hours]").inner_text() == "36.0"
    assert "charlie" in page.locator("[data-testid=table-user]").inner_text()

    with page.expect_download() as csv_download:
        page.locator("[data-testid=csv-user]").click()
    lines = Path(csv_download.value.path()).read_text().splitlines()
    assert lines[0].startswith("name,gpu_hours,used_gpu_hours,coverage_pct,mean_util_pct")
    # 20 of her 28 GPU-hours have samples (71.4 %), used half of that time: 10 used, 50 %.
    assert lines[1].startswith("alice,28.0,10.0,71.4,50.0")

    page.locator("[data-testid=make-pdf]").click()
    page.wait_for_selector("[data-testid=task-state-queued]")
    task = ReportTask.objects.get()
    report_task_run(task_id=task.pk)  # what the control worker does with the queued message
    page.wait_for_selector("[data-testid=download-pdf]", timeout=20000)  # htmx polls every 2 s
    with page.expect_download() as pdf_download:
        page.locator("[data-testid=download-pdf]").click()
    assert Path(pdf_download.value.path()).read_bytes()[:5] == b"%PDF-"


def test_a_member_sees_the_lab_totals_and_only_their_own_line(
    page: Any,
    live_server: Any,
    week: Any,  # noqa: F811
    bob: Any,
) -> None:
    log_in(page, live_server, "bob", PASSWORD)
    page.wait_for_selector("[data-testid=username]")
    page.goto(f"{live_server.url}/reports/?{QUERY}")
    assert page.locator("[data-testid=total-gpu-hours]").inner_text() == "36.0"
    users = page.locator("[data-testid=table-user]").inner_text()
    assert "bob" in users and "alice" not in users and "charlie" not in users
    assert page.locator("[data-testid=table-category]").count() == 0
    assert page.locator("[data-testid=whatif]").count() == 0

"""The report's opening for a funding panel: the lab, its inventory, one paragraph of
headline figures with the change since the rules came in, and tables that say why their
credits fall short of the lab total (on the hand-built week of tests/reports/conftest.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.test import Client
from django.utils import translation

from cluster.models import Node
from jobqueue.models import Job
from reports.models import LabProfile
from reports.narrative import Headline, inventory, narrative
from reports.selectors import usage_report
from reports.tables import report_tables
from tests.factories import ContainerImageFactory, GpuFactory, NodeFactory, default_queue
from tests.labportal.test_zh_typography import typography_faults
from tests.reports.conftest import MONDAY, NOW, at
from tests.reports.test_pdf import make_pdf, pdf_text

pytestmark = pytest.mark.django_db


def _story(week: Any, viewer: Any) -> Any:
    report = usage_report(period=week["period"], viewer=viewer, now=NOW)
    return report, narrative(report=report, viewer=viewer, forecast=None, now=NOW)


def test_the_inventory_lists_each_server_with_its_gpus_purchase_and_funding(week: Any) -> None:
    Node.objects.filter(name="gpu01").update(
        purchased_on=dt.date(2024, 5, 20), funded_by="NSFC 62276001"
    )
    NodeFactory.create(name="login01")  # no GPUs: not a GPU server
    GpuFactory.create(node=Node.objects.get(name="gpu02"), index=2, uuid="GPU-x", model="A100")

    lines = {line.node: line for line in inventory()}

    assert sorted(lines) == ["gpu01", "gpu02"]
    assert (lines["gpu01"].gpus, lines["gpu01"].models_label) == (2, "2 × A100")
    assert (lines["gpu01"].purchased_on, lines["gpu01"].funded_by) == (
        dt.date(2024, 5, 20),
        "NSFC 62276001",
    )
    assert (lines["gpu02"].gpus, lines["gpu02"].models_label) == (3, "1 × A100, 2 × L40S")
    assert lines["gpu02"].purchased_on is None


def test_the_headline_figures_are_the_reports_own(week: Any, admin_user: Any) -> None:
    report, story = _story(week, admin_user)
    head = story.headline
    # 4 GPUs for a week; 36 GPU-hours allocated, 24 of them covered, 14 used.
    assert head.capacity_gpu_hours == pytest.approx(4 * 7 * 24)
    assert head.allocation_pct == pytest.approx(100 * 36 / 672)
    assert head.coverage_pct == pytest.approx(100 * 24 / 36)
    assert head.util_pct == pytest.approx(100 * 14 / 24)
    # Waits: J1 2 h, J2 0 h, J3 6 h, J4 9 h.
    assert head.jobs_started == 4 and head.mean_wait_h == pytest.approx(17 / 4)
    assert head.unmet_gpu_hours == pytest.approx(report.unmet_gpu_hours)


def test_the_summary_names_the_lab_and_states_the_period_allocation_utilisation_and_waits(
    week: Any, admin_user: Any
) -> None:
    LabProfile.objects.create(name="Vision Lab", name_zh_hans="视觉实验室")
    _report, story = _story(week, admin_user)
    text = story.paragraph
    assert text.startswith("Vision Lab shares 4 GPUs on 2 servers")
    assert "From 2 Mar 2026 to 8 Mar 2026" in text
    assert "allocated 36.0 GPU-hours, 5.4% of what the GPUs could give" in text
    assert "Telemetry covered 66.7% of that time" in text and "58.3% busy" in text
    assert "4 jobs started after a mean wait of 4 h 15 min" in text
    assert "rules came in" not in text  # no day entered: no comparison is made up

    with translation.override("zh-hans"):
        _report, story = _story(week, admin_user)
        chinese = story.paragraph
    assert chinese.startswith("视觉实验室")
    assert "Vision Lab" not in chinese and "GPU-hours" not in chinese
    assert "2026年3月2日至2026年3月8日" in chinese and "平均等待 4 小时 15 分钟" in chinese
    assert typography_faults(chinese) == []  # sentences joined the Chinese way


def test_since_the_rules_came_in_the_same_span_before_is_compared_with_after(
    week: Any, admin_user: Any
) -> None:
    # Rules from Thursday: Thu–Sun (4 days, nothing ran) against Sun–Wed (all four jobs).
    LabProfile.objects.create(rules_since=MONDAY.date() + dt.timedelta(days=3))
    _report, story = _story(week, admin_user)
    compared = story.comparison
    assert compared is not None
    assert (compared.after_period.first_day, compared.after_period.last_day) == (
        dt.date(2026, 3, 5),
        dt.date(2026, 3, 8),
    )
    assert (compared.before_period.first_day, compared.before_period.last_day) == (
        dt.date(2026, 3, 1),
        dt.date(2026, 3, 4),
    )
    assert compared.before.allocated_gpu_hours == pytest.approx(36)
    assert compared.before.allocation_pct == pytest.approx(100 * 36 / (4 * 4 * 24))
    assert compared.after.allocated_gpu_hours == pytest.approx(0)
    assert "Since the lab's rules came in on 5 Mar 2026, allocation went from 9.4% to 0.0%" in (
        story.paragraph
    )


def test_no_comparison_when_nothing_ran_before_the_rules_or_they_come_after_the_period(
    week: Any, admin_user: Any
) -> None:
    profile = LabProfile.objects.create(rules_since=dt.date(2025, 1, 1))  # no history before
    assert _story(week, admin_user)[1].comparison is None
    profile.rules_since = dt.date(2026, 4, 1)  # after the period
    profile.save()
    assert _story(week, admin_user)[1].comparison is None


def test_tables_whose_credits_miss_the_bookings_say_so_and_empty_dash_rows_are_left_out(
    week: Any, admin_user: Any, alice: Any
) -> None:
    # A job cancelled before it ran: no node, no GPU model, no GPU-hours.
    Job.objects.create(
        owner=alice,
        queue=default_queue(),
        image=ContainerImageFactory.create(),
        command=["true"],
        gpus=1,
        state="cancelled",
        submitted_at=at(2, 0),
        ended_at=at(2, 1),
        time_limit_s=3600,
    )
    report = usage_report(period=week["period"], viewer=admin_user, now=NOW)
    assert "—" not in [line.name for line in report.tables["node"]]
    assert "—" not in [line.name for line in report.tables["model"]]
    assert report.totals.jobs["cancelled"] == 1  # still counted in the totals and its queue

    notes = {table.slug: table.note for table in report_tables(report)}
    # 28 credits in all; 6 of them are alice's booking, on no queue, node or model.
    for slug in ("queue", "node", "model"):
        assert notes[slug].startswith("6.0 credits of the lab total are not a portal job's"), slug
    assert notes["user"] == "" and notes["category"] == ""


def test_a_dash_row_with_gpu_hours_stays(week: Any, admin_user: Any, alice: Any) -> None:
    alice.category = None
    alice.save()
    report = usage_report(period=week["period"], viewer=admin_user, now=NOW)
    assert "—" in [line.name for line in report.tables["category"]]


@time_machine.travel(NOW, tick=False)
def test_the_page_opens_with_the_narrative_and_the_inventory(week: Any, admin_user: Any) -> None:
    LabProfile.objects.create(name="Vision Lab", institution="Example University")
    client = Client()
    client.force_login(admin_user)
    page = client.get("/reports/", {"period": "custom", "from": "2026-03-02", "to": "2026-03-08"})
    html = page.content.decode()
    assert page.status_code == 200
    assert "Example University · Vision Lab" in html
    assert "Vision Lab shares 4 GPUs on 2 servers" in html
    assert 'data-testid="inventory"' in html and "2 × L40S" in html
    assert 'data-testid="note-queue"' in html
    # Staff are told where purchase dates are entered while none is.
    assert "Purchase dates and funding are entered on each node" in html


@time_machine.travel(NOW, tick=False)
@pytest.mark.parametrize(
    ("language", "words"),
    [
        ("en", ["Vision Lab shares 4 GPUs", "GPU servers", "2024-05-20"]),
        ("zh-hans", ["视觉实验室"]),
    ],
)
def test_the_pdf_opens_with_the_same_narrative(
    week: Any, admin_user: Any, tmp_path: Path, language: str, words: list[str]
) -> None:
    LabProfile.objects.create(name="Vision Lab", name_zh_hans="视觉实验室")
    Node.objects.filter(name="gpu01").update(purchased_on=dt.date(2024, 5, 20))
    text, _pages, _images = pdf_text(make_pdf(week, admin_user, language), tmp_path)
    for word in words:
        assert word in text, word
    assert "2026-03-02 – 2026-03-08" in text  # the page's period


def test_headline_of_an_empty_report_has_no_made_up_figures(db: Any, admin_user: Any) -> None:
    from reports.periods import period_of

    report = usage_report(
        period=period_of("custom", dt.date(2026, 3, 2), dt.date(2026, 3, 8)),
        viewer=admin_user,
        now=NOW,
    )
    head = Headline.of(report)
    assert head.allocation_pct is None and head.util_pct is None and head.mean_wait_h is None

"""The PDF report, in English and in Chinese: pages, text, the figures and embedded charts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import time_machine

from reports.models import ReportTask
from reports.services import report_task_create, report_task_run
from tests.conftest import require_in_ci
from tests.reports.conftest import NOW

pytestmark = pytest.mark.django_db


def poppler(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        require_in_ci(f"{tool} (apt: poppler-utils)")
    assert path is not None
    return path


def pdf_text(pdf: bytes, tmp_path: Path) -> tuple[str, int, int]:
    """(text, pages, embedded images) as poppler sees the file."""
    path = tmp_path / "report.pdf"
    path.write_bytes(pdf)
    text = subprocess.run(
        [poppler("pdftotext"), "-layout", str(path), "-"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    info = subprocess.run(
        [poppler("pdfinfo"), str(path)], check=True, capture_output=True, text=True
    ).stdout
    pages = int(next(line.split()[-1] for line in info.splitlines() if line.startswith("Pages:")))
    images = subprocess.run(
        [poppler("pdfimages"), "-list", str(path)], check=True, capture_output=True, text=True
    ).stdout
    return text, pages, len(images.splitlines()) - 2  # two header lines


def make_pdf(week: Any, user: Any, language: str) -> bytes:
    task = report_task_create(kind="pdf", requester=user, period=week["period"], language=language)
    report_task_run(task_id=task.pk)
    task.refresh_from_db()
    assert task.state == ReportTask.State.DONE, task.error
    assert task.pdf is not None
    return bytes(task.pdf)


@time_machine.travel(NOW, tick=False)
@pytest.mark.parametrize(
    ("language", "words"),
    [
        ("en", ["Usage report", "GPU-hours allocated", "Per user", "Waits per queue", "Bookings"]),
        ("zh-hans", ["使用报告", "每个用户", "队列", "预约", "利用率"]),
    ],
)
def test_the_pdf_has_a_cover_charts_and_the_figures(
    week: Any, admin_user: Any, tmp_path: Path, language: str, words: list[str]
) -> None:
    pdf = make_pdf(week, admin_user, language)
    assert pdf[:5] == b"%PDF-"
    text, pages, images = pdf_text(pdf, tmp_path)
    assert pages >= 2  # the cover, then the tables
    assert images >= 2  # the weekly chart and the per-user chart
    for word in words:
        assert word in text, word
    # The figures of the fixture, as pdftotext reads them from the tables.
    for figure in ("36.0", "28.0", "50.0", "8.3", "2026-03-02"):
        assert figure in text, figure
    assert "alice" in text and "charlie" in text


@time_machine.travel(NOW, tick=False)
def test_a_members_pdf_has_only_their_own_line(week: Any, bob: Any, tmp_path: Path) -> None:
    text, _pages, _images = pdf_text(make_pdf(week, bob, "en"), tmp_path)
    assert "bob" in text and "alice" not in text and "charlie" not in text


def test_a_task_runs_once_even_if_the_message_comes_twice(week: Any, admin_user: Any) -> None:
    task = report_task_create(kind="pdf", requester=admin_user, period=week["period"])
    ReportTask.objects.filter(pk=task.pk).update(state=ReportTask.State.RUNNING)
    report_task_run(task_id=task.pk)  # a redelivery while the first run is busy: no-op
    task.refresh_from_db()
    assert task.state == ReportTask.State.RUNNING and task.pdf is None

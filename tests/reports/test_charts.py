"""The report's charts in Chinese: every glyph drawn, even where matplotlib's font cache
was built before the CJK font was installed."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import time_machine
from django.utils import translation
from matplotlib import font_manager

from reports import charts
from tests.conftest import require_in_ci
from tests.reports.conftest import NOW
from tests.reports.test_pdf import make_pdf

pytestmark = pytest.mark.django_db


@pytest.fixture
def stale_font_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """matplotlib's font list as a cache built before fonts-wqy-microhei came: no CJK font."""
    if not charts.cjk_font_files():
        require_in_ci("a Chinese font (apt: fonts-wqy-microhei)")
        pytest.skip("no Chinese font installed")
    manager = font_manager.fontManager
    cjk = set(charts.cjk_font_files())
    monkeypatch.setattr(manager, "ttflist", [f for f in manager.ttflist if f.fname not in cjk])
    manager._findfont_cached.cache_clear()  # type: ignore[attr-defined]
    assert not any(f.name in charts.CJK_FONTS for f in manager.ttflist)
    yield
    manager._findfont_cached.cache_clear()  # type: ignore[attr-defined]


def missing_glyphs(caplog: pytest.LogCaptureFixture, caught: list[Any]) -> list[str]:
    said = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    return [text for text in said if "missing from" in text or "Glyph" in text]


def test_a_chinese_chart_draws_every_glyph_though_the_font_cache_predates_the_font(
    stale_font_cache: None, caplog: pytest.LogCaptureFixture
) -> None:
    points: charts.WeeklyPoints = [
        ("2026-03-02", 30.0, 50.0, 90.0),
        ("2026-03-09", 65.0, None, 0.0),
    ]
    caplog.set_level(logging.WARNING, logger="matplotlib")
    with warnings.catch_warnings(record=True) as caught, translation.override("zh-hans"):
        warnings.simplefilter("always")
        png = charts.weekly_chart_of(points)
        bars = charts.usage_bar_chart(
            ["甲", "乙"], [3.0, 2.0], [1.0, 1.5], title="每个用户的 GPU 小时"
        )
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and bars[:8] == b"\x89PNG\r\n\x1a\n"
    assert missing_glyphs(caplog, caught) == []
    assert any(f.name in charts.CJK_FONTS for f in font_manager.fontManager.ttflist)


@time_machine.travel(NOW, tick=False)
def test_the_chinese_pdf_draws_its_charts_without_missing_glyphs(
    stale_font_cache: None, week: Any, admin_user: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="matplotlib")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdf = make_pdf(week, admin_user, "zh-hans")
    assert pdf[:5] == b"%PDF-"
    assert missing_glyphs(caplog, caught) == []


def test_no_fc_list_means_no_font_files_and_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(charts.shutil, "which", lambda _name: None)
    assert charts.cjk_font_files() == []

"""Charts of the report, drawn on the server by matplotlib (no JavaScript, same image in the PDF)."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # no display on a server

from django.core.cache import cache
from django.utils import translation
from django.utils.translation import gettext as _
from matplotlib import font_manager
from matplotlib.figure import Figure

if TYPE_CHECKING:
    from reports.forecast import Forecast
    from reports.lines import UsageReport

# Fonts that carry Chinese; the first one installed wins (fonts-wqy-microhei in CI).
CJK_FONTS = ("Noto Sans CJK SC", "WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "Source Han Sans SC")
_lock = threading.Lock()
# Drawn charts and the figures a page left for its chart's request (see cached_png).
CHART_CACHE_S = 24 * 3600
# Week labels are strings that look like dates; matplotlib's note about that is noise here.
logging.getLogger("matplotlib.category").setLevel(
    logging.WARNING
)  # matplotlib's font cache and text layout are not thread-safe


log = logging.getLogger(__name__)


def cjk_font_files() -> list[str]:
    """The font files fontconfig has for Chinese (`fc-list :lang=zh`), e.g. fonts-wqy-microhei's."""
    fc_list = shutil.which("fc-list")
    if fc_list is None:
        return []
    try:
        out = subprocess.run(
            [fc_list, ":lang=zh", "file"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        log.warning("fc-list failed: Chinese chart labels may show as boxes")
        return []
    return sorted({line.strip().rstrip(":") for line in out.splitlines() if line.strip()})


def register_cjk_fonts() -> None:
    """Add the Chinese font files to matplotlib's font list by path. Its font cache is built
    once, when matplotlib first runs, and a CJK font installed after that is not in it: the
    labels would be boxes. Adding the file directly needs no cache rebuild."""
    known = {f.fname for f in font_manager.fontManager.ttflist}
    for path in cjk_font_files():
        if path in known:
            continue
        try:
            font_manager.fontManager.addfont(path)
        except (OSError, RuntimeError, ValueError):
            log.warning("matplotlib cannot read the font %s", path)


def _font_family() -> list[str]:
    installed = {f.name for f in font_manager.fontManager.ttflist}
    if not any(name in installed for name in CJK_FONTS):
        register_cjk_fonts()
        installed = {f.name for f in font_manager.fontManager.ttflist}
    return [name for name in CJK_FONTS if name in installed] + ["DejaVu Sans"]


def _figure() -> Figure:
    fig = Figure(figsize=(7.5, 3.0), dpi=110, layout="constrained")
    return fig


def _render(fig: Figure, fmt: str) -> bytes:
    out = io.BytesIO()
    fig.savefig(out, format=fmt)
    return out.getvalue()


WeeklyPoints = list[tuple[str, float | None, float | None, float | None]]


def weekly_points(report: UsageReport) -> WeeklyPoints:
    """What the weekly chart plots: (Monday, allocation %, mean utilisation % over the covered
    time, telemetry coverage %) of each week; None where a week has no figure (a gap in the
    line, never a zero)."""
    return [
        (w.week.isoformat(), w.allocation_pct, w.mean_util_pct, w.coverage_pct)
        for w in report.weeks
    ]


def _gaps(values: list[float | None]) -> list[float]:
    return [math.nan if v is None else v for v in values]


def version_of(points: object) -> str:
    """A name for a chart's data: the same data, the same name (so the same image)."""
    text = json.dumps(points, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def cached_png(kind: str, points: object, draw: Callable[[], bytes]) -> bytes:
    """The chart drawn from `points`, from the cache when the same data was drawn in this
    language before: an image depends only on its data and its language, so a cached one is
    never stale, whatever changed since (changed data has another name)."""
    key = f"reports:chart:{kind}:{version_of(points)}:{translation.get_language() or ''}"
    png = cache.get(key)
    if png is None:
        png = draw()
        cache.set(key, png, CHART_CACHE_S)
    return bytes(png)


def remember_weekly_points(points: WeeklyPoints) -> str:
    """Keep a page's weekly figures for its chart's request, which then draws them instead
    of building the report again; returns the name the chart's URL carries."""
    version = version_of(points)
    cache.set(f"reports:chart:weekly-points:{version}", points, CHART_CACHE_S)
    return version


def remembered_weekly_points(version: str) -> WeeklyPoints | None:
    """The weekly figures a page left under `version`; None for a name it never gave."""
    if not re.fullmatch(r"[0-9a-f]{24}", version):
        return None
    points = cache.get(f"reports:chart:weekly-points:{version}")
    if points is None or version_of(points) != version:
        return None
    # Points a page left before the chart plotted coverage are drawn afresh.
    return points if all(len(point) == 4 for point in points) else None


def weekly_chart(report: UsageReport, *, fmt: str = "png") -> bytes:
    """Share of GPUs allocated and real utilisation per week, in %."""
    return weekly_chart_of(weekly_points(report), fmt=fmt)


def weekly_chart_of(points: WeeklyPoints, *, fmt: str = "png") -> bytes:
    """The weekly chart of `weekly_points`."""
    with _lock, matplotlib.rc_context({"font.family": _font_family()}):
        fig = _figure()
        ax = fig.add_subplot()
        weeks = [point[0] for point in points]
        ax.plot(weeks, _gaps([p[1] for p in points]), marker="o", label=_("Allocation %"))
        ax.plot(weeks, _gaps([p[2] for p in points]), marker="s", label=_("Mean utilisation %"))
        ax.plot(
            weeks,
            _gaps([p[3] for p in points]),
            linestyle="--",
            alpha=0.6,
            label=_("Telemetry coverage %"),
        )
        ax.set_ylim(0, 100)
        ax.set_ylabel("%")
        ax.set_title(_("Allocation, real utilisation and telemetry coverage per week"))
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize="small")
        fig.autofmt_xdate()
        return _render(fig, fmt)


def usage_bar_chart(
    names: Sequence[str],
    allocated: Sequence[float],
    used: Sequence[float],
    *,
    title: str,
    fmt: str = "png",
) -> bytes:
    """GPU-hours allocated and really used, side by side, for the top lines of a table."""
    with _lock, matplotlib.rc_context({"font.family": _font_family()}):
        fig = _figure()
        ax = fig.add_subplot()
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], allocated, width=0.4, label=_("GPU-hours allocated"))
        ax.bar([x + 0.2 for x in xs], used, width=0.4, label=_("GPU-hours really used"))
        ax.set_xticks(list(xs), list(names), rotation=30, ha="right")
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
        ax.legend()
        return _render(fig, fmt)


def forecast_chart(forecast: Forecast, *, fmt: str = "png") -> bytes:
    """Weekly GPU-hours of demand: history, the forecast and its uncertainty band."""
    with _lock, matplotlib.rc_context({"font.family": _font_family()}):
        fig = _figure()
        ax = fig.add_subplot()
        n = len(forecast.history_weeks)
        past = list(range(n))
        future = list(range(n, n + len(forecast.weeks)))
        ax.plot(past, forecast.history, marker=".", label=_("Demand (GPU-hours)"))
        ax.plot(future, forecast.mean, marker="o", label=_("Forecast"))
        ax.fill_between(future, forecast.lower, forecast.upper, alpha=0.25, label=_("80% band"))
        labels = [w.isoformat() for w in [*forecast.history_weeks, *forecast.weeks]]
        step = max(1, len(labels) // 10)
        ax.set_xticks(list(range(0, len(labels), step)), labels[::step])
        ax.set_title(_("Demand forecast, GPU-hours per week"))
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left")
        fig.autofmt_xdate()
        return _render(fig, fmt)

"""Charts of the report, drawn on the server by matplotlib (no JavaScript, same image in the PDF)."""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # no display on a server

from django.utils.translation import gettext as _  # noqa: E402
from matplotlib import font_manager  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

if TYPE_CHECKING:
    from reports.forecast import Forecast
    from reports.selectors import UsageReport

# Fonts that carry Chinese; the first one installed wins (fonts-wqy-microhei in CI).
CJK_FONTS = ("Noto Sans CJK SC", "WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "Source Han Sans SC")
_lock = threading.Lock()
# Week labels are strings that look like dates; matplotlib's note about that is noise here.
logging.getLogger("matplotlib.category").setLevel(
    logging.WARNING
)  # matplotlib's font cache and text layout are not thread-safe


def _font_family() -> list[str]:
    installed = {f.name for f in font_manager.fontManager.ttflist}
    return [name for name in CJK_FONTS if name in installed] + ["DejaVu Sans"]


def _figure() -> Figure:
    fig = Figure(figsize=(7.5, 3.0), dpi=110, layout="constrained")
    return fig


def _render(fig: Figure, fmt: str) -> bytes:
    out = io.BytesIO()
    fig.savefig(out, format=fmt)
    return out.getvalue()


def weekly_chart(report: UsageReport, *, fmt: str = "png") -> bytes:
    """Share of GPUs allocated and real utilisation per week, in %."""
    with _lock, matplotlib.rc_context({"font.family": _font_family()}):
        fig = _figure()
        ax = fig.add_subplot()
        weeks = [w.week.isoformat() for w in report.weeks]
        ax.plot(
            weeks,
            [w.allocation_pct or 0 for w in report.weeks],
            marker="o",
            label=_("Allocation %"),
        )
        ax.plot(
            weeks,
            [w.utilisation_pct or 0 for w in report.weeks],
            marker="s",
            label=_("Utilisation %"),
        )
        ax.set_ylim(0, 100)
        ax.set_ylabel("%")
        ax.set_title(_("Share of GPUs allocated and really used, per week"))
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left")
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

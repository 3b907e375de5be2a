"""The PDF report: the page's own tables and summary, laid out for print by WeasyPrint,
with the charts drawn by matplotlib and embedded as images."""

from __future__ import annotations

import base64

from django.template.loader import render_to_string
from django.utils import translation

from accounts.models import User
from reports import charts
from reports.forecast import ForecastState, latest_forecast
from reports.narrative import narrative
from reports.optional import require
from reports.periods import Period
from reports.selectors import usage_report
from reports.tables import report_tables


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def report_context(*, period: Period, viewer: User) -> dict[str, object]:
    """What the page and the PDF both show: the report, its opening narrative, its tables
    and the last fitted forecast (never fitted here: see reports.services.forecast_refresh)."""
    report = usage_report(period=period, viewer=viewer)
    forecast = forecast_context(latest_forecast())
    return {
        "report": report,
        "period": period,
        "tables": report_tables(report),
        "narrative": narrative(report=report, viewer=viewer, forecast=forecast["forecast"]),  # type: ignore[arg-type]
        **forecast,
    }


def forecast_context(state: ForecastState) -> dict[str, object]:
    """The forecast section's context: the last fitted forecast, its rows and its state."""
    forecast = state.forecast
    return {
        "forecast_state": state,
        "forecast": forecast,
        "forecast_rows": list(
            zip(forecast.weeks, forecast.mean, forecast.lower, forecast.upper, strict=True)
        )
        if forecast
        else [],
    }


def report_pdf(*, period: Period, viewer: User, language: str) -> bytes:
    """The report of `period` as `viewer` may see it, as a PDF in `language`."""
    HTML = require("weasyprint", "The PDF report").HTML

    from reports.services import forecast_refresh

    forecast_refresh()  # the control worker makes PDFs: a fit here blocks no web request
    with translation.override(language):
        context = report_context(period=period, viewer=viewer)
        report = context["report"]
        images = {"weekly": _data_uri(charts.weekly_chart(report))}  # type: ignore[arg-type]
        users = report.tables.get("user", [])[:12]  # type: ignore[attr-defined]
        if users:
            images["users"] = _data_uri(
                charts.usage_bar_chart(
                    [u.name for u in users],
                    [u.gpu_hours for u in users],
                    [u.used_gpu_hours for u in users],
                    title=str(translation.gettext("GPU-hours per user")),
                )
            )
        if context["forecast"] is not None:
            images["forecast"] = _data_uri(charts.forecast_chart(context["forecast"]))  # type: ignore[arg-type]
        html = render_to_string(
            "reports/report_pdf.html", {**context, "images": images, "LANGUAGE_CODE": language}
        )
    return HTML(string=html).write_pdf()

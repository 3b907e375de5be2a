"""The lab overview page."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from telemetry.selectors import lab_daily

OVERVIEW_DAYS = (30, 90, 365)


@login_required
def lab_overview(request: HttpRequest) -> HttpResponse:
    """The lab per day: share of GPU time allocated to jobs against real utilisation."""
    try:
        days = int(request.GET.get("days", "30"))
    except ValueError:
        days = 30
    days = days if days in OVERVIEW_DAYS else 30
    today = timezone.localdate()
    rows = lab_daily(start=today - timedelta(days=days - 1), end=today + timedelta(days=1))
    measured = [d for d in rows if d.util_mean is not None]
    return render(
        request,
        "telemetry/overview.html",
        {
            "days": days,
            "choices": OVERVIEW_DAYS,
            "rows": list(reversed(measured)),
            "mean_share": _mean(d.allocated_share for d in measured),
            "mean_util": _mean(d.util_mean for d in measured),
        },
    )


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None

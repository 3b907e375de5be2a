"""/metrics for Prometheus (behind a scrape token an admin issues), and the lab overview page."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from telemetry.metrics import metrics_registry, metrics_text
from telemetry.models import ScrapeToken
from telemetry.selectors import lab_daily

REGISTRY = metrics_registry()


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    scheme, _space, secret = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        return _refused(
            "Send the scrape token: Authorization: Bearer <token> (Prometheus: "
            "authorization.credentials_file). An admin issues tokens under "
            "Admin → Metrics scrape tokens."
        )
    if ScrapeToken.authenticate(secret.strip()) is None:
        return _refused("This scrape token is unknown or revoked; ask an admin for a new one.")
    return HttpResponse(metrics_text(REGISTRY), content_type=CONTENT_TYPE_LATEST)


def _refused(message: str) -> HttpResponse:
    response = HttpResponse(message + "\n", status=401, content_type="text/plain; charset=utf-8")
    response["WWW-Authenticate"] = 'Bearer realm="labportal-metrics"'
    return response


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

"""/metrics for Prometheus (behind a scrape token an admin issues), and /healthz."""

from __future__ import annotations

from functools import cache

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.registry import CollectorRegistry

from core.metrics import metrics_registry, metrics_text
from ops.health import health_report
from telemetry.models import ScrapeToken


@cache
def registry() -> CollectorRegistry:
    """Every collector the apps registered in their ready(), built on the first scrape."""
    return metrics_registry()


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
    return HttpResponse(metrics_text(registry()), content_type=CONTENT_TYPE_LATEST)


def _refused(message: str) -> HttpResponse:
    response = HttpResponse(message + "\n", status=401, content_type="text/plain; charset=utf-8")
    response["WWW-Authenticate"] = 'Bearer realm="labportal-metrics"'
    return response


def healthz(request: HttpRequest) -> JsonResponse:
    """For load balancers and the container healthcheck: 200 and "ok" only while every
    dependency answers (database, cache, broker, and Slurm in Slurm mode), else 503;
    `checks` says which one is down."""
    up, checks = health_report()
    return JsonResponse(
        {"status": "ok" if up else "down", "checks": checks}, status=200 if up else 503
    )

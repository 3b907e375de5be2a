"""/metrics for Prometheus (behind a scrape token an admin issues), and /healthz."""

from __future__ import annotations

from functools import cache

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from core.metrics import metrics_registry
from ops.health import freshness_report, health_report
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
    return HttpResponse(generate_latest(registry()), content_type=CONTENT_TYPE_LATEST)


def _refused(message: str) -> HttpResponse:
    response = HttpResponse(message + "\n", status=401, content_type="text/plain; charset=utf-8")
    response["WWW-Authenticate"] = 'Bearer realm="labportal-metrics"'
    return response


def healthz(request: HttpRequest) -> JsonResponse:
    """For load balancers, container healthchecks and uptime monitors.

    503 while a dependency is down (database, cache, broker, and Slurm in Slurm mode):
    this process cannot serve. Periodic work that has not run for too long (the last
    scheduling pass, the last backup) makes the status "degraded" but keeps 200, since the
    web tier can still serve and a load balancer must not take it out; ``?strict=1`` answers
    503 then too, for a monitor that should page someone. ``checks`` and ``periodic`` say
    which part is down or stale.
    """
    up, checks = health_report()
    fresh, periodic = freshness_report() if up else (False, {})
    strict = request.GET.get("strict", "") in {"1", "true", "yes"}
    status = "down" if not up else ("ok" if fresh else "degraded")
    code = 503 if not up or (strict and not fresh) else 200
    return JsonResponse({"status": status, "checks": checks, "periodic": periodic}, status=code)

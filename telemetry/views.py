"""/metrics for Prometheus, behind a scrape token an admin issues."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from telemetry.metrics import metrics_registry
from telemetry.models import ScrapeToken

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
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)


def _refused(message: str) -> HttpResponse:
    response = HttpResponse(message + "\n", status=401, content_type="text/plain; charset=utf-8")
    response["WWW-Authenticate"] = 'Bearer realm="labportal-metrics"'
    return response

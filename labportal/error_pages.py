"""Error pages in the site's layout, in the reader's language, in every mode."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils.translation import gettext as _
from django.views import defaults

logger = logging.getLogger(__name__)

# What the database driver raises when the server is away, restarting or refusing
# connections (and SQLite when its file cannot be opened or stays locked).
DATABASE_OUTAGE = (OperationalError, InterfaceError)
RETRY_AFTER_S = 30


def refusal(
    request: HttpRequest,
    *,
    status: int,
    code: str,
    title: str,
    detail: str,
    headers: dict[str, str] | None = None,
) -> HttpResponse:
    """An answer given before (or without) the view: JSON under /api/, else a page.

    The page is rendered without the request, so that no context processor, session or
    user lookup runs: it must render while the database is down.
    """
    if request.path_info.startswith("/api/"):
        return JsonResponse({"detail": detail, "code": code}, status=status, headers=headers)
    page = render_to_string("refusal.html", {"status": status, "title": title, "detail": detail})
    return HttpResponse(page, status=status, headers=headers)


class FriendlyNotFoundMiddleware:
    """With DEBUG on (the demo), Django answers a 404 with its URL list; members get the
    portal's own 404 page instead. Production (DEBUG off) renders `404.html` by itself.

    Under /api/ a path that matches no endpoint (``/api/jobs/0.5/``, a typo) is answered
    in JSON, like the API's other errors, in every mode: a script gets a message it can
    read, not the site's HTML page."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (
            response.status_code == 404
            and request.path.startswith("/api/")
            and response.get("Content-Type", "").startswith("text/html")
        ):
            return JsonResponse(
                {
                    "detail": _(
                        "No API endpoint at %(path)s. Check the path and any id in it "
                        "(ids are whole numbers); the endpoints are listed at /api/docs/."
                    )
                    % {"path": request.path},
                    "code": "no_endpoint",
                },
                status=404,
            )
        if (
            settings.DEBUG
            and response.status_code == 404
            and response.get("Content-Type", "").startswith("text/html")
        ):
            response = render(request, "404.html", status=404)
        return response


def outage_refusal(request: HttpRequest) -> HttpResponse:
    """503 with Retry-After: JSON under /api/, a page elsewhere; rendered without the database."""
    return refusal(
        request,
        status=503,
        code="database_unavailable",
        title=_("LabPortal is briefly unavailable"),
        detail=_(
            "LabPortal cannot reach its database at the moment. Try again in %(seconds)d "
            "seconds; if it lasts, tell the lab admins."
        )
        % {"seconds": RETRY_AFTER_S},
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


class DatabaseOutageMiddleware:
    """A view (the API's included) that fails because the database is away answers 503,
    not a 500 page: the request may simply be sent again."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, DATABASE_OUTAGE):
            return None
        logger.error("database unavailable for %s %s: %s", request.method, request.path, exception)
        return outage_refusal(request)


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: an outage met outside a view (loading the session or the user in a
    middleware) is a 503 as well; anything else is the usual 500 page."""
    if isinstance(sys.exc_info()[1], DATABASE_OUTAGE):
        return outage_refusal(request)
    return defaults.server_error(request)

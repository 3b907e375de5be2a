"""Error pages in the site's layout, in the reader's language, in every mode."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils.translation import gettext as _


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

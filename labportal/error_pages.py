"""Error pages in the site's layout, in the reader's language, in every mode."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


class FriendlyNotFoundMiddleware:
    """With DEBUG on (the demo), Django answers a 404 with its URL list; members get the
    portal's own 404 page instead. Production (DEBUG off) renders `404.html` by itself."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (
            settings.DEBUG
            and response.status_code == 404
            and response.get("Content-Type", "").startswith("text/html")
        ):
            response = render(request, "404.html", status=404)
        return response

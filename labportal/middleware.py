"""Request guards and response headers that apply to every page and API call."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.db import DatabaseError
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseBase,
    JsonResponse,
)
from django.middleware.gzip import GZipMiddleware
from django.urls import Resolver404, resolve
from django.utils.cache import patch_cache_control
from django.utils.translation import gettext as _

from core.request_body import body_limit_of, nul_checked_fields_of
from labportal.error_pages import refusal

NUL = "\x00"
FORM_CONTENT_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def nul_character_refusal(request: HttpRequest, where: str) -> HttpResponse:
    """A 400 that names where the NUL character was; JSON for the API, text for pages."""
    message = _(
        "The request contains a NUL character (\\0, %%00) in %(where)s. "
        "Remove it; no name, filter or text in LabPortal can contain one."
    ) % {"where": where}
    if request.path_info.startswith("/api/"):
        return JsonResponse({"detail": message, "code": "nul_character"}, status=400)
    return HttpResponseBadRequest(message, content_type="text/plain; charset=utf-8")


def _nul_location(request: HttpRequest) -> str | None:
    if NUL in request.path_info:
        return _("the address")
    for key, values in request.GET.lists():
        if NUL in key or any(NUL in value for value in values):
            return _("the query parameter “%(name)s”") % {"name": key.replace(NUL, "\\0")}
    if request.method == "POST" and request.content_type in FORM_CONTENT_TYPES:
        # CsrfViewMiddleware reads request.POST of every POST anyway; DRF reuses it.
        own: frozenset[str] | None = None  # the fields the page's form checks itself
        for key, values in request.POST.lists():
            if NUL in key or any(NUL in value for value in values):
                if own is None:
                    own = _form_checked_fields(request)
                if NUL not in key and key in own:
                    continue
                return _("the form field “%(name)s”") % {"name": key.replace(NUL, "\\0")}
    return None


def _form_checked_fields(request: HttpRequest) -> frozenset[str]:
    if request.path_info.startswith("/api/"):
        return frozenset()
    try:
        return nul_checked_fields_of(resolve(request.path_info).func)
    except Resolver404:
        return frozenset()


class RejectNulCharactersMiddleware:
    """Refuse a NUL in the path, the query string or a form body before any view runs.

    PostgreSQL text cannot hold a NUL, so a lookup or filter with one would fail
    deep in the database with a 500. JSON bodies are checked by the API's parsers
    (core.parsers), where a NUL inside a string is visible after decoding.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        where = _nul_location(request)
        if where is not None:
            return nul_character_refusal(request, where)
        return self.get_response(request)


class BoundedRequestBodyMiddleware:
    """Refuse a body larger than LABPORTAL_MAX_REQUEST_BYTES from its Content-Length, unread.

    DRF's JSON parser reads the whole stream, past Django's DATA_UPLOAD_MAX_MEMORY_SIZE: a
    300 MB body took 15.7 s and 536 MB of a web worker before its 400. A body sent without
    a length (chunked) is refused too: WSGI would hand the view an empty body instead.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        declared = request.META.get("CONTENT_LENGTH") or ""
        limit = settings.LABPORTAL_MAX_REQUEST_BYTES
        if not declared and "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower():
            status, code, title = 411, "length_required", _("Length required")
            detail = _(
                "The request body was sent without a Content-Length (chunked), which "
                "LabPortal does not read. Send it in one piece with its length."
            )
        elif declared.isdigit() and int(declared) > limit:
            status, code, title = 413, "request_too_large", _("Too much to send")
            own = _own_body_limit(request)
            if own is not None and int(declared) <= own[0]():
                return self.get_response(request)
            detail = (
                own[1](int(declared))
                if own is not None
                else _(
                    "The request body is %(size)s bytes; LabPortal takes at most %(max)s bytes. "
                    "Send less at once (split a batch of jobs into smaller ones)."
                )
                % {"size": f"{int(declared):,}", "max": f"{limit:,}"}
            )
        else:
            return self.get_response(request)
        return refusal(request, status=status, code=code, title=title, detail=detail)


def _own_body_limit(request: HttpRequest) -> tuple[Callable[[], int], Callable[[int], str]] | None:
    """The limit a view states for its bodies (file uploads), looked up only for large ones."""
    try:
        match = resolve(request.path_info)
    except Resolver404:
        return None
    return body_limit_of(match.func)


class SecurityHeadersMiddleware:
    """A Content-Security-Policy on every response; `private, no-store` for signed-in users.

    Pages of a signed-in member show their jobs, credits and tokens: no shared or
    browser cache may keep them. HSTS comes from Django's SecurityMiddleware
    (SECURE_HSTS_SECONDS), which sends it only over https.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        policy = settings.LABPORTAL_CONTENT_SECURITY_POLICY
        if policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = policy
        if _maybe_signed_in(request) or "HTTP_AUTHORIZATION" in request.META:
            patch_cache_control(response, private=True, no_store=True)
        return response


def _maybe_signed_in(request: HttpRequest) -> bool:
    """Whether the request is a signed-in member's; when the database is away the session
    cannot be read, and the answer is kept out of caches as if it were."""
    user = getattr(request, "user", None)
    try:
        return user is not None and user.is_authenticated
    except DatabaseError:
        return True


class CompressedPagesMiddleware(GZipMiddleware):
    """Gzip for pages and API answers whose client accepts it: a day of the calendar on
    64 GPUs is 650 KB of repetitive markup and 26 KB compressed, for about 3 ms of CPU.

    Django's own middleware, with two limits: a streaming answer (a live log, a file
    download, a session's events) is sent as it is, since gzip would hold its small
    chunks back until enough of them arrive; and only text is compressed (an image or
    an archive does not shrink). Compression follows Django's mitigation of BREACH (a
    random-length file name in each gzip header) and CSRF tokens are masked per request."""

    COMPRESSIBLE = ("text/", "application/json", "application/javascript", "image/svg+xml")
    MIN_BYTES = 1024

    def process_response(
        self, request: HttpRequest, response: HttpResponseBase
    ) -> HttpResponseBase:
        if response.streaming or len(getattr(response, "content", b"")) < self.MIN_BYTES:
            return response
        content_type = response.get("Content-Type", "")
        if not content_type.startswith(self.COMPRESSIBLE):
            return response
        return super().process_response(request, response)

"""The API's version, in its path: /api/v1/... (docs/api.md, "Versions and deprecation").

/api/... without a version is an alias of version 1, kept for the clients written before
versions: it answers the same, with `Deprecation`, `Sunset` and a `Link` to its successor
(RFC 9745, RFC 8594). The schema documents the versioned paths only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.utils.http import http_date
from django.utils.translation import gettext as _
from rest_framework import versioning
from rest_framework.exceptions import NotFound
from rest_framework.request import Request

CURRENT = "1"
VERSIONS = ("1",)
# /api/ without a version: deprecated since this date; answered at least until the sunset.
UNVERSIONED_DEPRECATED_AT = datetime(2026, 12, 1, tzinfo=UTC)
UNVERSIONED_SUNSET_AT = datetime(2027, 12, 31, tzinfo=UTC)

_VERSIONED = re.compile(r"^/api/v(?P<version>[0-9]+)/")


def is_unversioned_api(path: str) -> bool:
    return path.startswith("/api/") and not _VERSIONED.match(path)


class PathVersioning(versioning.URLPathVersioning):
    """`request.version` from the path's /api/v<N>/; "1" for the unversioned alias."""

    default_version = CURRENT
    allowed_versions = VERSIONS

    def determine_version(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        if self.version_param in kwargs:  # the schema generator names the version it documents
            return super().determine_version(request, *args, **kwargs)
        match = _VERSIONED.match(request.path_info)
        version = match["version"] if match else self.default_version
        if not self.is_allowed_version(version):
            raise NotFound(_("No such API version; the versions are: 1 (/api/v1/)."))
        return version

    def reverse(self, viewname: str, *args: Any, **kwargs: Any) -> str:
        # The paths take no version argument: reverse() names the versioned ones.
        return versioning.BaseVersioning.reverse(self, viewname, *args, **kwargs)


class UnversionedApiDeprecationMiddleware:
    """Marks each answer of the unversioned alias as deprecated, with its successor's path."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.deprecation = f"@{int(UNVERSIONED_DEPRECATED_AT.timestamp())}"
        self.sunset = http_date(UNVERSIONED_SUNSET_AT.timestamp())

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if is_unversioned_api(request.path_info):
            response["Deprecation"] = self.deprecation
            response["Sunset"] = self.sunset
            successor = f"/api/v{CURRENT}/{request.path_info.removeprefix('/api/')}"
            response["Link"] = f'<{successor}>; rel="successor-version"'
        return response


def versioned_paths_only(endpoints: list[Any], **kwargs: Any) -> list[Any]:
    """drf-spectacular's preprocessing hook: the schema leaves out the unversioned alias."""
    return [endpoint for endpoint in endpoints if not is_unversioned_api(endpoint[0])]

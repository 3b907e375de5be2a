"""Turns LabPortal's domain errors into clear 4xx answers for the API."""

from __future__ import annotations

from typing import Any

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from core.errors import DomainError


def domain_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler, plus DomainError -> its status with `detail` and `code`."""
    if isinstance(exc, DomainError):
        return Response(
            {"detail": str(exc.message), "code": exc.code},
            status=exc.status_code or status.HTTP_400_BAD_REQUEST,
        )
    return exception_handler(exc, context)

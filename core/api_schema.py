"""How the OpenAPI schema documents what every operation can answer besides success."""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema
from rest_framework import permissions

ERROR_BODY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "detail": {"type": "string", "description": "What was wrong and how to fix it."},
        "code": {"type": "string"},
    },
    "required": ["detail"],
}
INVALID_BODY: dict[str, Any] = {
    "type": "object",
    "description": "Either `detail` and `code` for a refused request, or each invalid "
    "field or parameter with a list of messages.",
    "additionalProperties": True,
}


class LabPortalAutoSchema(AutoSchema):
    """Adds the error answers to each operation: 400 (bad input: any request may be refused,
    if only for a NUL character), 401 and 403 where a sign-in is needed, 404 where the
    path names an object, 429 where a rate limit applies, and 409 and 429 (domain refusals)
    for the writes."""

    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        responses: dict[str, Any] = super()._get_response_bodies(direction)
        errors: dict[str, tuple[dict[str, Any], str]] = {
            "400": (INVALID_BODY, "Bad input; the body says what to change."),
        }
        if any(
            not issubclass(permission, permissions.AllowAny)
            for permission in getattr(self.view, "permission_classes", [])
        ):
            errors["401"] = (ERROR_BODY, "No valid credentials (Bearer token or session).")
            errors["403"] = (ERROR_BODY, "Not allowed for this member.")
            errors["429"] = (
                ERROR_BODY,
                "Too many requests: an API rate is reached (Retry-After says when to try "
                "again), or, for writes, a limit per member (e.g. queued jobs).",
            )
        if "{" in self.path:
            errors["404"] = (ERROR_BODY, "No such object, or not visible to this member.")
        if self.method != "GET":
            # Services refuse with named domain errors (core.api_errors).
            errors["409"] = (
                ERROR_BODY,
                "Conflicts with the current state (e.g. an overlapping booking, "
                "a request already awaiting a decision, a job already ended).",
            )
            errors.setdefault(
                "429",
                (
                    ERROR_BODY,
                    "A limit per member is reached (e.g. queued jobs, emergency requests "
                    "per period).",
                ),
            )
        for code, (body, description) in errors.items():
            if code not in responses:
                responses[code] = {
                    "content": {"application/json": {"schema": body}},
                    "description": description,
                }
        return responses


class SingleObjectAutoSchema(LabPortalAutoSchema):
    """For a router's `list` route that answers one object rather than a page of them."""

    def _is_list_view(self, serializer: Any = None) -> bool:
        return False

"""Query parameters of the API's lists, checked against what they may hold."""

from __future__ import annotations

from collections.abc import Iterable

from django.utils.translation import gettext as _
from drf_spectacular.utils import OpenApiParameter
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request


def choices_param(request: Request, name: str, choices: Iterable[str]) -> list[str]:
    """The comma-separated values of `?name=`, each one of `choices` (400 naming them if not)."""
    raw = request.query_params.get(name)
    if not raw:
        return []
    allowed = list(choices)
    values = [value.strip() for value in raw.split(",") if value.strip()]
    unknown = [value for value in values if value not in allowed]
    if unknown:
        raise ValidationError(
            {
                name: [
                    _("Unknown value “%(value)s”; use one or more of: %(allowed)s.")
                    % {"value": unknown[0], "allowed": ", ".join(allowed)}
                ]
            }
        )
    return values


def choices_schema_param(name: str, choices: Iterable[str], description: str) -> OpenApiParameter:
    """How `choices_param` is documented: a comma-separated list of the choices."""
    allowed = list(choices)
    return OpenApiParameter(
        name,
        str,
        description=(
            f"{description} One or more of: {', '.join(allowed)}, comma-separated; "
            "empty means no filter."
        ),
        pattern=rf"^(({'|'.join(allowed)})(,({'|'.join(allowed)}))*)?$",
    )

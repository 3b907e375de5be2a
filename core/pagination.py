"""Paging of the API's lists: bounded pages."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.utils.translation import gettext as _
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

MAX_PAGE_SIZE = 500


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """`?limit=` up to 500: a larger ask gets 500 results and `next` for the rest.

    Without a maximum, `?limit=` beyond a bigint reached the database and failed
    there, and `?limit=1000000` made one response of the whole table.
    """

    default_limit = 100
    max_limit = MAX_PAGE_SIZE

    # DRF reads a limit or offset that is not a whole number in range as if it were not
    # given: `?offset=-1` answered the first page and `?limit=0` a page of 100, so a
    # script with a paging bug got a plausible wrong answer. They are refused instead.
    def get_limit(self, request: Request) -> int | None:
        value = _query_number(
            request,
            self.limit_query_param,
            minimum=1,
            default=self.default_limit,
            refusal=lambda: (
                _(
                    "Give limit as a whole number from 1 to %(max)d, e.g. ?limit=50 "
                    "(larger values give %(max)d and a link to the next page)."
                )
                % {"max": self.max_limit}
            ),
        )
        return min(value, self.max_limit)

    def get_offset(self, request: Request) -> int:
        return _query_number(
            request,
            self.offset_query_param,
            minimum=0,
            default=0,
            refusal=lambda: _(
                "Give offset as a whole number of 0 or more, e.g. ?offset=100; "
                "or follow the answer's “next” link."
            ),
        )

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.limit_query_param:
                parameter["schema"]["minimum"] = 1
                parameter["description"] = (
                    f"Number of results to return per page: at most {self.max_limit}; a "
                    f"larger value gives {self.max_limit} and a `next` link."
                )
            elif parameter["name"] == self.offset_query_param:
                parameter["schema"]["minimum"] = 0
        return parameters


def _query_number(
    request: Request, name: str, *, minimum: int, default: int, refusal: Callable[[], str]
) -> int:
    """The query parameter ``name`` as a whole number of at least ``minimum``; ``default``
    when absent or empty; otherwise a 400 naming the parameter with ``refusal()`` (built
    only then: every list request passes here)."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    value = _whole_number(raw)
    if value is None or value < minimum:
        raise ValidationError({name: refusal()})
    return value


def _whole_number(text: str) -> int | None:
    """The integer an ASCII ``[-]digits`` text spells, else None. A huge limit is capped
    and a huge offset gives an empty page, so length is not limited here (except by
    Python's own limit on digits, whose ValueError means None too)."""
    text = text.strip()
    digits = text.removeprefix("-")
    if not (digits.isascii() and digits.isdigit()):
        return None
    try:
        return int(text)
    except ValueError:
        return None

"""Paging of the API's lists: bounded pages."""

from __future__ import annotations

from typing import Any

from rest_framework.pagination import LimitOffsetPagination

MAX_PAGE_SIZE = 500


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """`?limit=` up to 500: a larger ask gets 500 results and `next` for the rest.

    Without a maximum, `?limit=` beyond a bigint reached the database and failed
    there, and `?limit=1000000` made one response of the whole table.
    """

    default_limit = 100
    max_limit = MAX_PAGE_SIZE

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.limit_query_param:
                parameter["schema"].update({"minimum": 1, "maximum": self.max_limit})
                parameter["description"] = (
                    f"Number of results to return per page (at most {self.max_limit})."
                )
            elif parameter["name"] == self.offset_query_param:
                parameter["schema"]["minimum"] = 0
        return parameters

"""The API's JSON parser: refuses text that no database column can store."""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext as _
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser, MultiPartParser


def _unstorable_text(value: Any, path: str) -> str | None:
    """The JSON path of the first string (or key) holding a NUL or a lone surrogate."""
    if isinstance(value, str):
        if "\x00" in value:
            return path
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = _unstorable_text(key, path) or _unstorable_text(item, f"{path}.{key}")
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _unstorable_text(item, f"{path}[{index}]")
            if found:
                return found
    return None


def _refuse_unstorable(data: Any) -> None:
    where = _unstorable_text(data, "$")
    if where is not None:
        raise ParseError(
            _(
                "The request body has a NUL character (\\u0000) or an unpaired surrogate in %(where)s. "
                "Remove it; LabPortal cannot store such text."
            )
            % {"where": where}
        )


class StrictJSONParser(JSONParser):
    """JSON whose strings hold no NUL (\\u0000) and no lone surrogate, which PostgreSQL refuses."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        data = super().parse(stream, media_type, parser_context)
        _refuse_unstorable(data)
        return data


class StrictMultiPartParser(MultiPartParser):
    """Multipart form fields under the same rule (urlencoded forms are checked by the
    RejectNulCharactersMiddleware)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        parsed = super().parse(stream, media_type, parser_context)
        _refuse_unstorable({key: parsed.data.getlist(key) for key in parsed.data})
        return parsed

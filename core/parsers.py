"""The API's JSON parser: refuses text that no database column can store."""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext as _
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser, MultiPartParser

# No request of ours nests deeper than a few levels; a body nested this deep is refused
# before anything walks it (a thousand levels were a RecursionError, a 500).
MAX_JSON_DEPTH = 64


class _TooDeep(Exception):
    pass


def _text_is_unstorable(value: str) -> bool:
    if "\x00" in value:
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _unstorable_text(value: Any, path: str) -> str | None:
    """The JSON path of the first string (or key) holding a NUL or a lone surrogate.

    Walked with a stack of its own, so depth costs no recursion; deeper than
    MAX_JSON_DEPTH raises _TooDeep."""
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, str):
            if _text_is_unstorable(item):
                return where
            continue
        if depth >= MAX_JSON_DEPTH and isinstance(item, dict | list):
            raise _TooDeep
        children: list[tuple[Any, str, int]] = []
        if isinstance(item, dict):
            for key, child in item.items():
                if _text_is_unstorable(key):
                    return where
                children.append((child, f"{where}.{key}", depth + 1))
        elif isinstance(item, list):
            children = [(child, f"{where}[{i}]", depth + 1) for i, child in enumerate(item)]
        stack.extend(reversed(children))
    return None


def _too_deep() -> ParseError:
    return ParseError(
        _("The request body nests deeper than %(max)d levels; send flatter JSON.")
        % {"max": MAX_JSON_DEPTH}
    )


def _refuse_unstorable(data: Any) -> None:
    try:
        where = _unstorable_text(data, "$")
    except _TooDeep:
        raise _too_deep() from None
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
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise _too_deep() from None
        _refuse_unstorable(data)
        return data


class StrictMultiPartParser(MultiPartParser):
    """Multipart form fields under the same rule (urlencoded forms are checked by the
    RejectNulCharactersMiddleware)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        parsed = super().parse(stream, media_type, parser_context)
        _refuse_unstorable({key: parsed.data.getlist(key) for key in parsed.data})
        return parsed

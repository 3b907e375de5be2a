"""Texts stored now and read later, in the reader's language."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.utils.functional import Promise, lazy
from django.utils.translation import get_language, gettext

from core.moments import when_with_zone


def _render(msgid: str, params: dict[str, Any]) -> str:
    text = gettext(msgid)
    return text % {k: str(v) for k, v in params.items()} if params else text


_lazy_render = lazy(_render, str)


def lazy_text(msgid: str, /, **params: Any) -> Any:
    """`gettext(msgid) % params`, evaluated when turned into a string (so in the language
    active then: `accounts.services.notify` renders it in the member's language). Parameter
    values may themselves be lazy."""
    return _lazy_render(msgid, params)


def reader_reads_chinese() -> bool:
    """Whether the active language is Chinese (zh-hans and its variants)."""
    return (get_language() or "").lower().startswith("zh")


def join_sentences(parts: Iterable[str]) -> str:
    """Sentences one after another in the reader's language: a space between them in
    English, none in Chinese (GLOSSARY.md); empty ones left out."""
    return ("" if reader_reads_chinese() else " ").join(part for part in parts if part)


def in_reader_language(english: str, chinese: str) -> str:
    """The value in the reader's language; the other one when that one is empty."""
    first, second = (chinese, english) if reader_reads_chinese() else (english, chinese)
    return first or second


# A text kept as what to say, not as words: a message id, its parameters (themselves stored
# texts, moments or plain values), rendered in the language active when it is read. A value
# that cannot be kept so (a lazy text of another kind) is stored as its words instead.
def _hours_minutes(seconds: float) -> str:
    from core.durations import hours_minutes

    return hours_minutes(seconds)


_STORABLE: dict[str, Any] = {"text": _render, "gettext": gettext, "hours_minutes": _hours_minutes}


def stored_form(value: Any) -> Any:
    """The JSON form of `value` for `rendered`, or None where it has none."""
    if isinstance(value, Promise):
        reduced: Any = value.__reduce__()
        func: Any = reduced[1][0] if len(reduced[1]) >= 3 else None
        args: Any = reduced[1][1] if func is not None else ()
        kwargs: Any = reduced[1][2] if func is not None else {}
        name = next((n for n, f in _STORABLE.items() if f is func), None)
        if name is None and getattr(func, "__qualname__", "") == "hours_minutes":
            name = "hours_minutes"
        if name is None or kwargs:
            return None
        parts = [stored_form(arg) for arg in args]
        return None if any(p is None for p in parts) else {"$": name, "a": parts}
    if isinstance(value, dict):
        items = {str(k): stored_form(v) for k, v in value.items()}
        return None if any(v is None for v in items.values()) else {"$": "dict", "a": items}
    if isinstance(value, datetime):
        return {"$": "when", "a": value.isoformat()}
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return str(value)
    return None


def rendered(form: Any) -> Any:
    """A stored form's words in the active language (its moments in the lab's time zone)."""
    if not isinstance(form, dict):
        return form
    kind: Any = form.get("$")
    arg: Any = form.get("a")
    if kind == "dict":
        return {k: rendered(v) for k, v in arg.items()}
    if kind == "when":
        return when_with_zone(datetime.fromisoformat(arg))
    func = _STORABLE.get(str(kind))
    if func is None:
        return ""
    return func(*[rendered(a) for a in arg])

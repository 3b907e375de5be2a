"""Texts stored now and read later, in the reader's language."""

from __future__ import annotations

from typing import Any

from django.utils.functional import lazy
from django.utils.translation import get_language, gettext


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


def in_reader_language(english: str, chinese: str) -> str:
    """The value in the reader's language; the other one when that one is empty."""
    first, second = (chinese, english) if reader_reads_chinese() else (english, chinese)
    return first or second

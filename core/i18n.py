"""Texts stored now and read later, in the reader's language."""

from __future__ import annotations

from typing import Any

from django.utils.functional import lazy
from django.utils.translation import gettext


def _render(msgid: str, params: dict[str, Any]) -> str:
    text = gettext(msgid)
    return text % {k: str(v) for k, v in params.items()} if params else text


_lazy_render = lazy(_render, str)


def lazy_text(msgid: str, /, **params: Any) -> Any:
    """`gettext(msgid) % params`, evaluated when turned into a string (so in the language
    active then: `accounts.services.notify` renders it in the member's language). Parameter
    values may themselves be lazy."""
    return _lazy_render(msgid, params)

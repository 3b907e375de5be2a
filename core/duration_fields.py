"""Lengths of time typed as people write them (`90m`, `2h`, `1d 6h`) and stored as seconds.

The admin's forms show and accept these units for every field that the database keeps
in seconds; the stored value is the same whole number of seconds as before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.db import models
from django.utils.functional import Promise
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

UNITS: dict[str, int] = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_PART = re.compile(r"(\d+)\s*([dhms])")
_WHOLE = re.compile(r"^\s*(?:\d+\s*[dhms]\s*)+$")

HOW_TO_WRITE = _("Write a duration such as 90m, 2h or 1d (d days, h hours, m minutes, s seconds).")


def parse_duration(text: str) -> int:
    """Seconds in `text`: `2h` 7200, `1d 6h` 108000, `90m` 5400, a bare `0` 0.

    A bare number other than 0 is refused: it used to mean seconds and now would be
    read as something else, so the admin is asked to say which unit.
    """
    cleaned = text.strip().lower()
    if cleaned == "0":
        return 0
    if not _WHOLE.match(cleaned):
        raise ValueError(cleaned)
    return sum(int(n) * UNITS[unit] for n, unit in _PART.findall(cleaned))


def format_duration(seconds: int | None) -> str:
    """The shortest writing of `seconds` that `parse_duration` reads back: `1d 6h`, `30m`, `0`."""
    if seconds is None:
        return ""
    total = int(seconds)
    if total == 0:
        return "0"
    parts = []
    for unit, size in UNITS.items():
        count, total = divmod(total, size)
        if count:
            parts.append(f"{count}{unit}")
    return " ".join(parts)


class HumanDurationInput(forms.TextInput):
    def format_value(self, value: Any) -> str | None:
        if isinstance(value, int):
            return format_duration(value)
        return super().format_value(value)


class HumanDurationField(forms.Field):
    """A number of seconds, typed and shown in days, hours, minutes and seconds."""

    widget = HumanDurationInput
    default_error_messages = {
        "invalid": HOW_TO_WRITE,
        "max_value": _("Write at most %(limit)s."),
    }

    def __init__(self, *, max_value: int | None = None, **kwargs: Any) -> None:
        self.max_value = max_value
        kwargs.setdefault("help_text", HOW_TO_WRITE)
        super().__init__(**kwargs)
        self.widget.attrs.setdefault("placeholder", "2h")
        self.widget.attrs.setdefault("size", "10")

    def to_python(self, value: Any) -> int | None:
        if value in self.empty_values:
            return None
        if isinstance(value, int):
            return value
        try:
            seconds = parse_duration(str(value))
        except ValueError:
            raise ValidationError(self.error_messages["invalid"], code="invalid") from None
        if self.max_value is not None and seconds > self.max_value:
            raise ValidationError(
                self.error_messages["max_value"],
                code="max_value",
                params={"limit": format_duration(self.max_value)},
            )
        return seconds

    def prepare_value(self, value: Any) -> Any:
        return format_duration(value) if isinstance(value, int) else value


# PositiveIntegerField's largest value on every database the portal runs on.
_LARGEST = 2147483647


class HumanDurationAdminMixin:
    """Admin forms with `duration_labels`' fields (seconds in the database) in human units.

    `duration_labels` maps each field to its label without "(seconds)"; the field's own
    help text, if any, comes first and the way to write a duration follows.
    """

    duration_labels: Mapping[str, str | Promise] = {}

    def formfield_for_dbfield(
        self, db_field: models.Field[Any, Any], request: Any, **kwargs: Any
    ) -> forms.Field | None:
        label = self.duration_labels.get(db_field.name)
        if label is None:
            return super().formfield_for_dbfield(db_field, request, **kwargs)  # type: ignore[misc]
        help_text: Any = HOW_TO_WRITE
        if db_field.help_text:
            help_text = format_lazy("{} {}", db_field.help_text, HOW_TO_WRITE)
        return HumanDurationField(
            label=label,
            required=not db_field.blank,
            max_value=_LARGEST,
            help_text=help_text,
            initial=db_field.get_default() if db_field.has_default() else None,
        )

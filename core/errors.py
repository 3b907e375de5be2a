"""The base of LabPortal's named domain errors, raised by services."""

from __future__ import annotations

from django.utils.functional import Promise
from django.utils.translation import gettext


class DomainError(Exception):
    """A refusal the user can act on: `message` says what was wrong and how to fix it."""

    code = "invalid"
    status_code = 400

    def __init__(self, message: str | Promise) -> None:
        super().__init__(str(message))
        self.message = message


def text_too_long(field: str, length: int, limit: int) -> str:
    """The refusal of a text over its limit, naming the field, in the reader's language."""
    return gettext("“%(field)s” is %(length)d characters long; at most %(max)d are allowed.") % {
        "field": field,
        "length": length,
        "max": limit,
    }


class NotAllowed(DomainError):
    code = "not_allowed"
    status_code = 403


class StaffOnly(NotAllowed):
    code = "staff_only"

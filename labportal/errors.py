"""The base of LabPortal's named domain errors, raised by services."""

from __future__ import annotations

from django.utils.functional import Promise


class DomainError(Exception):
    """A refusal the user can act on: `message` says what was wrong and how to fix it."""

    code = "invalid"
    status_code = 400

    def __init__(self, message: str | Promise) -> None:
        super().__init__(str(message))
        self.message = message


class NotAllowed(DomainError):
    code = "not_allowed"
    status_code = 403

"""Named refusals of the reports: each message says what to change."""

from __future__ import annotations

from core.errors import DomainError


class BadPeriod(DomainError):
    """A report period that cannot be read or makes no sense."""

    code = "bad_period"


class BadReplay(DomainError):
    """A what-if replay asked for with options that cannot be simulated."""

    code = "bad_replay"

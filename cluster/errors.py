"""Named refusals of the cluster services."""

from __future__ import annotations

from core.errors import DomainError


class SlotsRefused(DomainError):
    """The GPU's shared slots cannot be changed as asked (now)."""

    code = "slots_refused"
    status_code = 409

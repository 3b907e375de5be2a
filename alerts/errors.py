"""Named refusals of the alerts services."""

from __future__ import annotations

from core.errors import DomainError


class AlertNotOpen(DomainError):
    code = "alert_not_open"
    status_code = 409

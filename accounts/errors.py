"""Named refusals of the credits and notifications services."""

from __future__ import annotations

from core.errors import DomainError


class UnknownLedgerKind(DomainError):
    code = "unknown_ledger_kind"


class InvalidAmount(DomainError):
    code = "invalid_amount"


class InvalidMonth(DomainError):
    code = "invalid_month"

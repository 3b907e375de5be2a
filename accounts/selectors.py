"""Reads of credits and notifications that the pages, the API and the scheduler share."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.db.models import Exists, OuterRef, QuerySet, Sum
from django.utils import timezone

from accounts.models import CreditAccount, LedgerEntry, Notification, User
from accounts.services import next_grant_date

BURN_RATE_DAYS = 7
# What a member spends on compute: charges, bookings and no-shows, less refunds and rewards.
SPENDING_KINDS = (
    LedgerEntry.Kind.CHARGE,
    LedgerEntry.Kind.RESERVATION,
    LedgerEntry.Kind.NO_SHOW,
    LedgerEntry.Kind.REFUND,
    LedgerEntry.Kind.REWARD,
)


def has_credit() -> Exists:
    """Whether the member (the outer row) has a balance above zero (no account counts as zero).

    The scheduler orders the jobs of members without credit after the others'; it never
    blocks them (the pass reads this with the members' rows)."""
    return Exists(CreditAccount.objects.filter(user=OuterRef("pk"), balance__gt=0))


def balance_of(user: User) -> Decimal:
    return CreditAccount.objects.filter(user=user).values_list(
        "balance", flat=True
    ).first() or Decimal("0")


def credits_charged_for_job(job_id: int) -> Decimal:
    """What a job cost its owner, net: charges less refunds and the efficiency reward."""
    total = LedgerEntry.objects.filter(job_id=job_id).aggregate(total=Sum("amount"))["total"]
    return -(total or Decimal("0"))


@dataclass(frozen=True)
class CreditSummary:
    balance: Decimal
    burn_per_day: Decimal
    runs_out_at: datetime | None
    next_grant_on: date
    # Whole days left at this rate (0: within a day), shown instead of a "2 weeks, 6 days".
    runs_out_in_days: int | None = None


def credit_summary(user: User, *, now: datetime | None = None) -> CreditSummary:
    """The balance, the net spending per day over the last week, and when it runs out at that rate."""
    now = now or timezone.now()
    balance = balance_of(user)
    spent = -(
        LedgerEntry.objects.filter(
            account__user=user,
            kind__in=SPENDING_KINDS,
            created_at__gte=now - timedelta(days=BURN_RATE_DAYS),
            created_at__lte=now,
        ).aggregate(s=Sum("amount"))["s"]
        or Decimal("0")
    )
    burn = max(Decimal("0"), spent / BURN_RATE_DAYS).quantize(Decimal("0.001"))
    runs_out_at, runs_out_in_days = None, None
    if burn > 0 and balance > 0:
        runs_out_at = now + timedelta(days=float(balance / burn))
        runs_out_in_days = int(balance / burn)
    return CreditSummary(
        balance=balance,
        burn_per_day=burn,
        runs_out_at=runs_out_at,
        next_grant_on=next_grant_date(timezone.localdate(now)),
        runs_out_in_days=runs_out_in_days,
    )


def ledger_for(
    user: User, *, kind: str | None = None, month: date | None = None
) -> QuerySet[LedgerEntry]:
    """The member's ledger, newest first, optionally one kind and/or one calendar month."""
    qs = LedgerEntry.objects.filter(account__user=user).select_related("job", "created_by")
    if kind:
        qs = qs.filter(kind=kind)
    if month:
        qs = qs.filter(created_at__year=month.year, created_at__month=month.month)
    return qs


def ledger_months(user: User) -> list[date]:
    """The months in which the member has entries, newest first (for the filter)."""
    return [
        d.date() if isinstance(d, datetime) else d
        for d in LedgerEntry.objects.filter(account__user=user).dates(
            "created_at", "month", order="DESC"
        )
    ]


def unread_notification_count(user: User) -> int:
    return Notification.objects.for_user(user).unread().count()


def notifications_for(user: User, *, unread_only: bool = False) -> QuerySet[Notification]:
    qs = Notification.objects.for_user(user)
    return qs.unread() if unread_only else qs

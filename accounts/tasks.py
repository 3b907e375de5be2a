"""Celery tasks of the ledger, the monthly grant and notifications: thin, safe to run twice."""

from __future__ import annotations

import logging

from celery import shared_task

from accounts import services
from accounts.models import CreditAccount

log = logging.getLogger(__name__)


@shared_task(
    name="control.credits_monthly_grant", time_limit=600, soft_time_limit=540, ignore_result=True
)
def credits_monthly_grant_task() -> int:
    # Beat runs this hourly: the first run of a month grants, later runs find nothing to do.
    return services.credits_monthly_grant()


@shared_task(name="control.credits_check_ledger", time_limit=300, ignore_result=True)
def credits_check_ledger_task() -> int:
    """Log every account whose cached balance is not the sum of its entries (should never happen)."""
    # django-stubs loses the ledger_sum annotation at inconsistent()'s declared return type
    # (typeddjango/django-stubs#1190), so it cannot resolve the annotated name here.
    broken = list(
        CreditAccount.objects.inconsistent().values_list(  # type: ignore[misc]
            "user__username", "balance", "ledger_sum"
        )
    )
    for username, balance, ledger_sum in broken:
        log.error(
            "credit account of %s: balance %s but entries sum to %s", username, balance, ledger_sum
        )
    return len(broken)


@shared_task(
    name="control.notification_email", time_limit=120, soft_time_limit=100, ignore_result=True
)
def notification_email_task(notification_id: int) -> None:
    # Idempotent: a notification already emailed (emailed_at set) is not sent again.
    services.notification_email_send(notification_id)

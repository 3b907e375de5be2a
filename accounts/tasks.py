"""Celery tasks of credits and approvals: thin, take ids, safe to run twice."""

from __future__ import annotations

import logging

from celery import shared_task

from accounts import services
from accounts.models import CreditAccount

log = logging.getLogger(__name__)


@shared_task(
    name="control.credits_charge_running_jobs",
    time_limit=240,
    soft_time_limit=200,
    ignore_result=True,
)
def credits_charge_running_jobs_task() -> int:
    return services.credits_charge_running_jobs()


@shared_task(
    name="control.credits_monthly_grant", time_limit=600, soft_time_limit=540, ignore_result=True
)
def credits_monthly_grant_task() -> int:
    # Beat runs this hourly: the first run of a month grants, later runs find nothing to do.
    return services.credits_monthly_grant()


@shared_task(name="control.credits_settle_job", time_limit=120, ignore_result=True)
def credits_settle_job_task(job_id: int) -> None:
    services.credits_settle_job(job_id=job_id)


@shared_task(
    name="control.credits_settle_ended_jobs",
    time_limit=300,
    soft_time_limit=240,
    ignore_result=True,
)
def credits_settle_ended_jobs_task() -> int:
    # Beat, every minute: a settle lost after a job's end (see jobqueue's _after_final).
    return services.credits_settle_ended_jobs()


@shared_task(name="control.credits_refund_job", time_limit=120, ignore_result=True)
def credits_refund_job_task(job_id: int, reason: str) -> None:
    services.credits_refund_job(job_id=job_id, reason=reason)


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


@shared_task(name="control.notification_email", time_limit=120, ignore_result=True)
def notification_email_task(notification_id: int) -> None:
    # Idempotent: a notification already emailed (emailed_at set) is not sent again.
    services.notification_email_send(notification_id)


@shared_task(name="control.approvals_expire", time_limit=120, ignore_result=True)
def approvals_expire_task() -> dict[str, int]:
    from jobqueue import approvals

    return {
        "grants": approvals.grants_expire(),
        "emergencies": approvals.emergencies_expire(),
    }

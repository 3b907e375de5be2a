from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest


def portal(request: HttpRequest) -> dict[str, Any]:
    """What the base layout shows on every page."""
    return {
        "LABPORTAL_SIMULATION": settings.LABPORTAL_ALLOW_SIMULATION,
        "SIGNUP_OPEN": settings.LABPORTAL_SIGNUP_MODE == "approval",
        "credit_balance": _credit_balance(request),
        "unread_notifications": _unread_notifications(request),
        "pending_approvals": _pending_approvals(request),
    }


def _pending_approvals(request: HttpRequest) -> int:
    """For staff, how many grant and emergency requests await a decision (shown in the nav)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or not user.is_staff:
        return 0
    from jobqueue.models import EmergencyRequest, PriorityGrant

    return (
        PriorityGrant.objects.filter(state=PriorityGrant.State.PENDING).count()
        + EmergencyRequest.objects.filter(state=EmergencyRequest.State.PENDING).count()
    )


def _credit_balance(request: HttpRequest) -> Any:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    account = getattr(user, "credit_account", None)
    return getattr(account, "balance", None)


def _unread_notifications(request: HttpRequest) -> int:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return 0
    from accounts.selectors import unread_notification_count

    return unread_notification_count(user)

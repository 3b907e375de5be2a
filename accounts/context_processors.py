from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest


def portal(request: HttpRequest) -> dict[str, Any]:
    """What the base layout shows on every page."""
    return {
        "LABPORTAL_SIMULATION": settings.LABPORTAL_ALLOW_SIMULATION,
        "SIGNUP_OPEN": settings.LABPORTAL_SIGNUP_MODE == "approval",
        "CAMPUS_NAME": settings.LABPORTAL_CAMPUS_NAME,
        "CAMPUS_LDAP": settings.LABPORTAL_LDAP_ENABLED,
        "CAMPUS_OIDC": settings.LABPORTAL_OIDC_ENABLED,
        "credit_balance": _credit_balance(request),
        "unread_notifications": _unread_notifications(request),
    }


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

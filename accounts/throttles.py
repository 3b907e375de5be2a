"""The API's rate limits: every request, and the costly actions (submits, reports) apart.

Counted per personal access token (a script's), else per signed-in member (the pages'
htmx calls, labctl with a session), else per client address (as the login lockout reads
it, X-Forwarded-For only from LABPORTAL_TRUSTED_PROXIES). Past a limit the API answers
429 with Retry-After. The rates are settings (LABPORTAL_API_RATE_*), read per request.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from accounts.lockout import client_address
from accounts.models import PersonalAccessToken


class _LabRateThrottle(SimpleRateThrottle):
    scope_name: str | None = None

    def __init__(self) -> None:
        # The rate is looked up per request (get_rate), so a changed setting counts at once.
        pass

    def scope_for(self, view: Any) -> str | None:
        return self.scope_name

    def get_rate(self) -> str | None:
        return settings.LABPORTAL_API_RATES.get(self.scope or "")

    def allow_request(self, request: Request, view: Any) -> bool:
        self.scope = self.scope_for(view)
        self.rate = self.get_rate() if self.scope else None
        if self.rate is None:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, view)

    def get_cache_key(self, request: Request, view: Any) -> str:
        if isinstance(request.auth, PersonalAccessToken):
            ident = f"token:{request.auth.pk}"
        elif request.user and request.user.is_authenticated:
            ident = f"user:{request.user.pk}"
        else:
            ident = f"address:{client_address(request._request)}"
        return f"api-throttle:{self.scope}:{ident}"


class ApiRateThrottle(_LabRateThrottle):
    """Every API request: LABPORTAL_API_RATE (default 1200/min)."""

    scope_name = "api"


class ActionRateThrottle(_LabRateThrottle):
    """A view's costly actions, named by its ``throttle_scopes`` ({action: scope}):
    submits (LABPORTAL_API_RATE_SUBMIT) and reports (LABPORTAL_API_RATE_REPORT)."""

    def scope_for(self, view: Any) -> str | None:
        scopes: dict[str, str] = getattr(view, "throttle_scopes", {})
        return scopes.get(getattr(view, "action", None) or "")

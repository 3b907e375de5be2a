"""allauth policy: signup closed by default; in approval mode an admin approves first;
failed sign-ins lock the account or the address for a short, announced time."""

from __future__ import annotations

from typing import Any

from allauth.account.adapter import DefaultAccountAdapter
from allauth.socialaccount.adapter import DefaultSocialAccountAdapter
from django import forms
from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils.translation import gettext as _

from accounts import lockout
from accounts.directory import apply_oidc

# The provider_id of the campus OpenID Connect app (labportal/campus_login.py).
CAMPUS_PROVIDER_ID = "campus"


def _login_of(credentials: dict[str, Any]) -> str:
    return str(credentials.get("email") or credentials.get("username") or "")


class LabAccountAdapter(DefaultAccountAdapter):
    def is_open_for_signup(self, request: HttpRequest) -> bool:
        return settings.LABPORTAL_SIGNUP_MODE == "approval"

    def save_user(self, request: HttpRequest, user: Any, form: Any, commit: bool = True) -> Any:
        user = super().save_user(request, user, form, commit=False)
        user.approval = user.Approval.PENDING
        if commit:
            user.save()
        return user

    def pre_login(self, request: HttpRequest, user: Any, **kwargs: Any) -> HttpResponse | None:
        if getattr(user, "approval", "approved") != "approved":
            messages.warning(
                request,
                _(
                    "Your account is waiting for an administrator's approval. "
                    "You can log in once it is approved."
                ),
            )
            return redirect("account_login")
        return super().pre_login(request, user, **kwargs)

    def get_client_ip(self, request: HttpRequest) -> str:
        """allauth's own rate limits count the same address as the lockout."""
        return lockout.client_address(request)

    def pre_authenticate(self, request: HttpRequest, **credentials: Any) -> None:
        super().pre_authenticate(request, **credentials)
        refused = lockout.login_lockout(
            login=_login_of(credentials), address=lockout.client_address(request)
        )
        if refused is not None:
            raise forms.ValidationError(refused.message, code="too_many_login_attempts")

    def authenticate(self, request: HttpRequest, **credentials: Any) -> Any:
        user = super().authenticate(request, **credentials)
        if user is not None:
            lockout.login_success_record(login=_login_of(credentials))
        return user

    def authentication_failed(self, request: HttpRequest, **credentials: Any) -> None:
        locked = lockout.login_failure_record(
            login=_login_of(credentials), address=lockout.client_address(request)
        )
        if locked is not None:
            raise forms.ValidationError(locked.message, code="too_many_login_attempts")


class LabSocialAccountAdapter(DefaultSocialAccountAdapter):
    """Campus OpenID Connect: a first sign-in creates the member (the campus vouches for
    them, whatever LABPORTAL_SIGNUP_MODE says); every sign-in maps the groups claim to the
    category and takes the unix uid where the provider sends one (accounts/directory.py)."""

    def is_open_for_signup(self, request: HttpRequest, sociallogin: Any) -> bool:
        return sociallogin.account.provider == CAMPUS_PROVIDER_ID

    def save_user(self, request: HttpRequest, sociallogin: Any, form: Any = None) -> Any:
        user = super().save_user(request, sociallogin, form)
        if sociallogin.account.provider == CAMPUS_PROVIDER_ID:
            apply_oidc(request, user, sociallogin.account.extra_data)
        return user

    def pre_social_login(self, request: HttpRequest, sociallogin: Any) -> None:
        super().pre_social_login(request, sociallogin)
        if sociallogin.is_existing and sociallogin.account.provider == CAMPUS_PROVIDER_ID:
            apply_oidc(request, sociallogin.user, sociallogin.account.extra_data)

"""allauth policy: signup closed by default; in approval mode an admin approves first."""

from __future__ import annotations

from typing import Any

from allauth.account.adapter import DefaultAccountAdapter
from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils.translation import gettext as _


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

from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from accounts.forms import TokenCreateForm
from accounts.models import PersonalAccessToken


@login_required
def token_list(request: HttpRequest) -> HttpResponse:
    form = TokenCreateForm(request.POST or None)
    new_secret = None
    if request.method == "POST" and form.is_valid():
        days = form.cleaned_data["lifetime_days"]
        _token, new_secret = PersonalAccessToken.issue(
            user=request.user,  # type: ignore[arg-type]
            name=form.cleaned_data["name"],
            lifetime=timedelta(days=days) if days else None,
        )
        form = TokenCreateForm()
    tokens = PersonalAccessToken.objects.filter(user=request.user)
    return render(
        request,
        "accounts/tokens.html",
        {"form": form, "tokens": tokens, "new_secret": new_secret},
    )


@login_required
@require_POST
def token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    token = get_object_or_404(PersonalAccessToken, pk=pk, user=request.user)
    token.revoke()
    messages.success(request, _("Token “%(name)s” revoked.") % {"name": token.name})
    return redirect("token_list")

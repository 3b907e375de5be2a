from __future__ import annotations

import re
from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from accounts import selectors, services
from accounts.auth import request_user
from accounts.forms import LedgerFilterForm, TokenCreateForm
from accounts.models import CreditPolicy, Notification, PersonalAccessToken
from core.form_pages import form_page_status


@login_required
def token_list(request: HttpRequest) -> HttpResponse:
    user = request_user(request)
    form = TokenCreateForm(request.POST or None)
    new_secret = None
    if request.method == "POST" and form.is_valid():
        days = form.cleaned_data["lifetime_days"]
        _token, new_secret = PersonalAccessToken.issue(
            user=user,
            name=form.cleaned_data["name"],
            lifetime=timedelta(days=days) if days else None,
        )
        form = TokenCreateForm()
    tokens = PersonalAccessToken.objects.filter(user=user)
    return render(
        request,
        "accounts/tokens.html",
        {"form": form, "tokens": tokens, "new_secret": new_secret},
        status=form_page_status(request, form),
    )


@login_required
@require_POST
def token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    token = get_object_or_404(PersonalAccessToken, pk=pk, user=request_user(request))
    token.revoke()
    messages.success(request, _("Token “%(name)s” revoked.") % {"name": token.name})
    return redirect("token_list")


@login_required
def credits(request: HttpRequest) -> HttpResponse:
    """My credits: balance, burn rate and run-out estimate, and the ledger with filters."""
    user = request_user(request)
    form = LedgerFilterForm(request.GET or None)
    if form.is_bound and not form.is_valid():
        entries = selectors.ledger_for(user).none()
    else:
        entries = selectors.ledger_for(
            user,
            kind=form.cleaned_data.get("kind") if form.is_bound else None,
            month=form.month_start() if form.is_bound else None,
        )
    page = Paginator(entries, 50).get_page(request.GET.get("page"))
    return render(
        request,
        "accounts/credits.html",
        {
            "form": form,
            "page": page,
            "summary": selectors.credit_summary(user),
            "months": selectors.ledger_months(user),
            "policy": CreditPolicy.current(),
        },
    )


@login_required
def credits_summary(request: HttpRequest) -> HttpResponse:
    """The live part of My credits (htmx polls it)."""
    return render(
        request,
        "accounts/_credit_summary.html",
        {"summary": selectors.credit_summary(request_user(request))},
    )


@login_required
def notifications(request: HttpRequest) -> HttpResponse:
    page = Paginator(selectors.notifications_for(request_user(request)), 50).get_page(
        request.GET.get("page")
    )
    return render(request, "accounts/notifications.html", {"page": page})


@login_required
def notification_bell(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "accounts/_bell.html",
        {"unread_notifications": selectors.unread_notification_count(request_user(request))},
    )


@login_required
@require_POST
def notifications_read(request: HttpRequest) -> HttpResponse:
    """Mark one notification (`id`) or all of them read, then go to its link or back to the list."""
    user = request_user(request)
    raw_id = request.POST.get("id", "")
    if raw_id:
        # str.isdigit() also accepts "²" and other digits int() refuses.
        if not re.fullmatch(r"[0-9]{1,18}", raw_id):
            messages.error(request, _("That notification does not exist."))
            return redirect("notifications")
        note = get_object_or_404(Notification, pk=int(raw_id), user=user)
        services.notifications_mark_read(user=user, notification_ids=[note.pk])
        safe = note.url.startswith("/") and not note.url.startswith("//")
        return redirect(note.url if safe else "notifications")
    services.notifications_mark_read(user=user)
    return redirect("notifications")


@login_required
@require_POST
def notification_settings(request: HttpRequest) -> HttpResponse:
    """The member's own switches: for now, whether to be told when a job ends."""
    user = request_user(request)
    user.notify_job_end = request.POST.get("notify_job_end") == "on"
    user.save(update_fields=["notify_job_end"])
    messages.success(request, _("Notification settings saved."))
    return redirect("notifications")

"""Pages of the approvals: members apply for grants and emergencies, staff decide."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from functools import wraps
from typing import Any, cast

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from accounts.auth import request_user
from accounts.models import CreditPolicy, User
from approvals import services as approvals
from core.errors import DomainError, text_too_long
from core.form_pages import form_page_status
from jobqueue.models import EmergencyRequest, Job, PriorityGrant

# --- Forms: input checks only; the rules live in approvals.services ----------------


class GrantApplyForm(forms.Form):
    reason = forms.CharField(
        label=gettext_lazy("Why you need the high-priority queue"),
        widget=forms.Textarea(attrs={"rows": 4}),
        max_length=2000,
        help_text=gettext_lazy(
            "E.g. the paper deadline or the thesis defence, and what you need to run."
        ),
    )
    deadline = forms.DateTimeField(
        label=gettext_lazy("Until"),
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%d"],
        help_text=gettext_lazy("The grant lapses by itself at this time."),
        error_messages={
            "invalid": gettext_lazy("Give the deadline as a date and time, e.g. 2025-06-30 18:00.")
        },
    )
    gpus_expected = forms.IntegerField(
        label=gettext_lazy("GPUs expected"), min_value=1, max_value=512, initial=1
    )


class WaitingJobsField(forms.ModelMultipleChoiceField[Job]):
    def label_from_instance(self, obj: Job) -> str:
        return f"#{obj.pk} {obj.name or obj.command_display[:60]} ({obj.queue.name}, {obj.get_state_display()})"


class EmergencyForm(forms.Form):
    jobs = WaitingJobsField(
        label=gettext_lazy("Jobs"),
        queryset=Job.objects.none(),
        widget=forms.CheckboxSelectMultiple,
        error_messages={"required": gettext_lazy("Tick at least one of your waiting jobs.")},
    )
    reason = forms.CharField(
        label=gettext_lazy("What is the emergency?"),
        widget=forms.Textarea(attrs={"rows": 3}),
        max_length=2000,
    )
    hours = forms.IntegerField(label=gettext_lazy("Hours of top priority"), min_value=1)

    def __init__(self, *args: Any, user: User, policy: CreditPolicy, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cast(WaitingJobsField, self.fields["jobs"]).queryset = approvals.emergency_jobs_eligible(
            user
        )
        hours = cast(forms.IntegerField, self.fields["hours"])
        hours.max_value = policy.emergency_max_hours
        hours.widget.attrs["max"] = policy.emergency_max_hours
        hours.initial = policy.emergency_default_hours


COMMENT_CHARS = 2000


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "approve"), ("reject", "reject")])
    comment = forms.CharField(required=False, max_length=COMMENT_CHARS)


def staff_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Members get 403, not a login page: they are logged in, just not allowed."""

    @wraps(view)
    @login_required
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_staff:
            raise PermissionDenied(_("Only lab admins can decide on requests."))
        return view(request, *args, **kwargs)

    return wrapped


# --- Member pages --------------------------------------------------------------------


@login_required
def grant_apply(request: HttpRequest) -> HttpResponse:
    queue = approvals.grant_queues().order_by("tier").first()
    initial = {
        "deadline": (timezone.localtime() + timedelta(days=14)).replace(
            minute=0, second=0, microsecond=0
        )
    }
    user = request_user(request)
    form = GrantApplyForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            approvals.grant_apply(
                user=user,
                reason=form.cleaned_data["reason"],
                deadline=form.cleaned_data["deadline"],
                gpus_expected=form.cleaned_data["gpus_expected"],
            )
        except DomainError as exc:
            form.add_error(None, str(exc.message))
        else:
            messages.success(
                request,
                _(
                    "Your request is sent. An admin will approve or reject it; you will be notified."
                ),
            )
            return redirect("grant_apply")
    grants = approvals.grants_visible_to(user).filter(user=user)
    return render(
        request,
        "approvals/grant_apply.html",
        {"form": form, "queue": queue, "grants": grants},
        status=form_page_status(request, form),
    )


@login_required
@require_POST
def grant_withdraw(request: HttpRequest, pk: int) -> HttpResponse:
    user = request_user(request)
    grant = get_object_or_404(PriorityGrant, pk=pk, user=user)
    try:
        approvals.grant_withdraw(grant_id=grant.pk, user=user)
    except DomainError as exc:
        messages.error(request, str(exc.message))
    else:
        messages.success(request, _("Request withdrawn."))
    return redirect("grant_apply")


@login_required
def emergency_apply(request: HttpRequest) -> HttpResponse:
    policy = CreditPolicy.current()
    user = request_user(request)
    form = EmergencyForm(request.POST or None, user=user, policy=policy)
    if request.method == "POST" and form.is_valid():
        try:
            approvals.emergency_request_create(
                user=user,
                job_ids=[job.pk for job in form.cleaned_data["jobs"]],
                reason=form.cleaned_data["reason"],
                hours=form.cleaned_data["hours"],
            )
        except DomainError as exc:
            form.add_error(None, str(exc.message))
        else:
            messages.success(request, _("Your emergency request is sent to the lab admins."))
            return redirect("emergency_apply")
    return render(
        request,
        "approvals/emergency_apply.html",
        {
            "form": form,
            "policy": policy,
            "uses_left": approvals.emergency_uses_left(user),
            "requests": approvals.emergencies_visible_to(user).filter(user=user),
        },
        status=form_page_status(request, form),
    )


# --- Staff pages ---------------------------------------------------------------------


@staff_required
def approvals_queue(request: HttpRequest) -> HttpResponse:
    user = request_user(request)
    grants = approvals.grants_visible_to(user)
    emergencies = approvals.emergencies_visible_to(user)
    return render(
        request,
        "approvals/approvals.html",
        {
            "pending_grants": grants.filter(state=PriorityGrant.State.PENDING).order_by("deadline"),
            "pending_emergencies": emergencies.filter(
                state=EmergencyRequest.State.PENDING
            ).order_by("created_at"),
            "recent_grants": grants.exclude(state=PriorityGrant.State.PENDING)[:20],
            "recent_emergencies": emergencies.exclude(state=EmergencyRequest.State.PENDING)[:20],
        },
    )


def _decide(
    request: HttpRequest,
    row: PriorityGrant | EmergencyRequest,
    decide: Callable[..., Any],
    row_template: str,
    context_name: str,
    **ids: int,
) -> HttpResponse:
    form = DecisionForm(request.POST)
    if not form.is_valid():
        comment = request.POST.get("comment", "")
        if "comment" in form.errors:
            messages.error(request, text_too_long("comment", len(comment), COMMENT_CHARS))
        else:
            messages.error(request, _("Choose approve or reject."))
        return redirect("approvals")
    approve = form.cleaned_data["decision"] == "approve"
    try:
        obj = decide(
            decided_by=request_user(request),
            approve=approve,
            comment=form.cleaned_data["comment"],
            **ids,
        )
    except DomainError as exc:
        if request.htmx:  # type: ignore[attr-defined]
            # The row stays as it was, with why: not the whole page swapped into the row.
            return render(request, row_template, {context_name: row, "error": str(exc.message)})
        messages.error(request, str(exc.message))
        return redirect("approvals")
    if request.htmx:  # type: ignore[attr-defined]
        return render(request, row_template, {context_name: obj, "decided": True})
    messages.success(request, _("Approved.") if approve else _("Rejected."))
    return redirect("approvals")


@staff_required
@require_POST
def grant_decide(request: HttpRequest, pk: int) -> HttpResponse:
    grant = get_object_or_404(PriorityGrant, pk=pk)
    return _decide(
        request, grant, approvals.grant_decide, "approvals/_grant_row.html", "grant", grant_id=pk
    )


@staff_required
@require_POST
def emergency_decide(request: HttpRequest, pk: int) -> HttpResponse:
    emergency = get_object_or_404(EmergencyRequest, pk=pk)
    return _decide(
        request,
        emergency,
        approvals.emergency_decide,
        "approvals/_emergency_row.html",
        "request_obj",
        request_id=pk,
    )

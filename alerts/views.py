from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from accounts.auth import request_user
from alerts import selectors, services
from alerts.models import Alert
from approvals.views import staff_required
from core.errors import DomainError


@login_required
def alert_list(request: HttpRequest) -> HttpResponse:
    """Staff see every alert; a member sees the alerts about their own jobs and GPUs."""
    state = request.GET.get("state", "")
    if state not in Alert.State.values:
        state = ""
    user = request_user(request)
    alerts = selectors.alerts_for_staff_page(state=state or None)
    if not user.is_staff:
        alerts = alerts.about_user(user)
    page = Paginator(alerts, 50).get_page(request.GET.get("page"))
    open_alerts = Alert.objects.open()
    return render(
        request,
        "alerts/alert_list.html",
        {
            "page": page,
            "state": state,
            "states": Alert.State.choices,
            "staff": user.is_staff,
            "open_count": (open_alerts if user.is_staff else open_alerts.about_user(user)).count(),
        },
    )


@staff_required
@require_POST
def alert_acknowledge(request: HttpRequest, pk: int) -> HttpResponse:
    alert = get_object_or_404(Alert, pk=pk)
    try:
        services.alert_acknowledge(alert_id=alert.pk, actor=request_user(request))
    except DomainError as exc:
        messages.error(request, str(exc.message))
    else:
        messages.success(request, _("Alert #%(id)d acknowledged.") % {"id": alert.pk})
    return redirect("alert_list")

"""Pages: the calendar, booking, slot suggestions, My reservations and the iCal feed."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import floatformat
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST

from core.durations import hours_minutes
from core.errors import DomainError
from core.form_pages import form_page_status
from reservations import ical
from reservations.errors import ReservationError
from reservations.forms import BookingForm, ExtendForm, SuggestForm, empty_suggest_form_html
from reservations.models import BookingRule, CalendarFeed, Reservation
from reservations.selectors import calendar_view, reservation_suggest, reservations_of_user
from reservations.services import (
    reservation_cancel,
    reservation_create,
    reservation_extend,
    reservation_release_early,
)
from reservations.slotfinder import FreeSlot


def _local_day(value: str | None) -> date:
    try:
        return date.fromisoformat(value) if value else timezone.localdate()
    except ValueError:
        return timezone.localdate()


def _midnight(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, datetime.min.time()))


def _book_url(**params: Any) -> str:
    return reverse("reservation_book") + "?" + urlencode(params, doseq=True)


def _local_input(moment: datetime) -> str:
    return timezone.localtime(moment).strftime("%Y-%m-%dT%H:%M")


def book_url_for_slot(slot: FreeSlot) -> str:
    return _book_url(
        gpus=list(slot.gpu_ids), start=_local_input(slot.start), end=_local_input(slot.end)
    )


@login_required
def reservation_calendar(request: HttpRequest) -> HttpResponse:
    """GPUs × time, a day or a week, with bookings, running jobs and the usual busy hours."""
    week = request.GET.get("view") == "week"
    day = _local_day(request.GET.get("date"))
    if week:
        day -= timedelta(days=day.weekday())
    days = 7 if week else 1
    rules = BookingRule.for_user(request.user)
    step = timedelta(hours=1) if week else min(rules.granularity, timedelta(hours=1))
    now = timezone.now()
    context = calendar_view(user=request.user, start=_midnight(day), days=days, now=now, step=step)
    context.update(
        {
            "week": week,
            "day": day,
            "previous": (day - timedelta(days=days)).isoformat(),
            "next": (day + timedelta(days=days)).isoformat(),
            "today": timezone.localdate().isoformat(),
            "step_minutes": int(step.total_seconds() // 60),
            "suggest_form_html": empty_suggest_form_html(),
            "rules": rules,
            "now": now,
        }
    )
    template = (
        "reservations/_calendar_grid.html"
        if request.htmx and request.GET.get("partial")  # type: ignore[attr-defined]
        else "reservations/calendar.html"
    )
    return render(request, template, context)


@login_required
def reservation_book(request: HttpRequest) -> HttpResponse:
    """The booking form: GET prefilled from the calendar (gpus, start, end), POST books."""
    suggestion: FreeSlot | None = None
    if request.method == "POST":
        form = BookingForm(request.POST, user=request.user)
        if form.is_valid():
            data = form.cleaned_data
            try:
                reservation = reservation_create(
                    user=request.user,
                    gpu_ids=[g.pk for g in data["gpus"]] if data["gpus"] else None,
                    node=data["node"] if not data["gpus"] else None,
                    gpu_count=data["gpu_count"] if not data["gpus"] else None,
                    start=data["start"],
                    end=data["end"],
                    note=data["note"],
                    maintenance=data.get("maintenance", False),
                )
            except ReservationError as refusal:
                form.add_error(None, str(refusal.message))
                suggestion = refusal.suggestion
            except DomainError as refusal:
                form.add_error(None, str(refusal.message))
            else:
                messages.success(
                    request,
                    _("Booked %(gpus)s from %(start)s to %(end)s.")
                    % {
                        "gpus": ", ".join(g.label for g in reservation.gpus.select_related("node")),
                        "start": timezone.localtime(reservation.start).strftime("%Y-%m-%d %H:%M"),
                        "end": timezone.localtime(reservation.end).strftime("%Y-%m-%d %H:%M"),
                    },
                )
                target = (
                    reverse("reservation_calendar")
                    + "?"
                    + urlencode({"date": timezone.localtime(reservation.start).date().isoformat()})
                )
                if request.htmx:  # type: ignore[attr-defined]
                    response = HttpResponse(status=204)
                    response["HX-Redirect"] = target
                    return response
                return redirect(target)
    else:
        initial: dict[str, Any] = {}
        if request.GET.getlist("gpus"):
            initial["gpus"] = request.GET.getlist("gpus")
        for key in ("start", "end", "node", "gpu_count"):
            if request.GET.get(key):
                initial[key] = request.GET[key]
        form = BookingForm(initial=initial, user=request.user)
    context = {
        "form": form,
        "suggestion": suggestion,
        "suggestion_url": book_url_for_slot(suggestion) if suggestion else "",
    }
    template = "reservations/_book_form.html" if request.htmx else "reservations/book.html"  # type: ignore[attr-defined]
    return render(request, template, context, status=form_page_status(request, form))


@login_required
@require_GET
def reservation_suggest_view(request: HttpRequest) -> HttpResponse:
    """The earliest free slot for N GPUs on one node for H hours."""
    form = SuggestForm(request.GET or None)
    slot = None
    searched = False
    if form.is_valid():
        searched = True
        data = form.cleaned_data
        slot = reservation_suggest(
            user=request.user,
            gpu_count=data["gpu_count"],
            length=timedelta(hours=float(data["hours"])),
            after=data["after"],
            node_id=data["node"].pk if data["node"] else None,
        )
    context = {
        "suggest_form": form,
        "slot": slot,
        "searched": searched,
        "slot_url": book_url_for_slot(slot) if slot else "",
    }
    template = "reservations/_suggest.html" if request.htmx else "reservations/suggest.html"  # type: ignore[attr-defined]
    return render(request, template, context)


@login_required
def reservation_list(request: HttpRequest) -> HttpResponse:
    """My reservations: cancel, release early, extend; and the iCal subscription address."""
    feed = CalendarFeed.for_user(request.user)
    feed_url = request.build_absolute_uri(reverse("reservation_ical", args=[feed.url_token]))
    return render(
        request,
        "reservations/list.html",
        {
            **reservations_of_user(user=request.user),
            "now": timezone.now(),
            "extend_form": ExtendForm(),
            "feed_url": feed_url,
        },
    )


def _own_reservation(request: HttpRequest, pk: int) -> Reservation:
    return get_object_or_404(Reservation.objects.for_user(request.user), pk=pk)


def _run_action(request: HttpRequest, action: Any, success: str, **kwargs: Any) -> HttpResponse:
    try:
        action(actor=request.user, **kwargs)
    except DomainError as refusal:
        messages.error(request, str(refusal.message))
    else:
        messages.success(request, success)
    return redirect("reservation_list")


@login_required
@require_POST
def reservation_cancel_view(request: HttpRequest, pk: int) -> HttpResponse:
    reservation = _own_reservation(request, pk)
    return _run_action(
        request,
        reservation_cancel,
        _("Reservation cancelled and refunded."),
        reservation_id=reservation.pk,
    )


@login_required
@require_POST
def reservation_release_view(request: HttpRequest, pk: int) -> HttpResponse:
    reservation = _own_reservation(request, pk)
    return _run_action(
        request,
        reservation_release_early,
        _("Reservation released; the unused time was refunded."),
        reservation_id=reservation.pk,
    )


@login_required
@require_POST
def reservation_extend_view(request: HttpRequest, pk: int) -> HttpResponse:
    reservation = _own_reservation(request, pk)
    form = ExtendForm(request.POST)
    if not form.is_valid():
        rules = BookingRule.for_user(reservation.user)
        messages.error(
            request,
            _(
                "Give the number of hours to extend by, e.g. 1 or 0.5. A booking may last at "
                "most %(hours)s hours in all; this one already lasts %(now)s."
            )
            % {
                "hours": floatformat(rules.max_length.total_seconds() / 3600, -1),
                "now": hours_minutes(reservation.end - reservation.start),
            },
        )
        return redirect("reservation_list")
    hours: Decimal = form.cleaned_data["hours"]
    return _run_action(
        request,
        reservation_extend,
        _("Reservation extended."),
        reservation_id=reservation.pk,
        new_end=reservation.end + timedelta(hours=float(hours)),
    )


@login_required
@require_POST
def calendar_feed_reset(request: HttpRequest) -> HttpResponse:
    CalendarFeed.for_user(request.user).reset()
    messages.success(request, _("New calendar address made; the old one no longer works."))
    return redirect("reservation_list")


@require_GET
def reservation_ical(request: HttpRequest, token: str) -> HttpResponse:
    """The member's bookings as iCalendar; the secret in the URL stands in for a session."""
    feed = CalendarFeed.from_url_token(token)
    if feed is None or not feed.user.is_active:
        raise Http404
    now = timezone.now()
    bookings = (
        Reservation.objects.filter(user=feed.user, end__gte=now - timedelta(days=90))
        .prefetch_related("gpus__node")
        .order_by("start")
    )
    body = ical.calendar_for(
        bookings,
        name=_("LabPortal bookings of %(user)s") % {"user": feed.user.username},
        host=request.get_host().split(":")[0] or "labportal",
        now=now,
        link=request.build_absolute_uri(reverse("reservation_list")),
    )
    response = HttpResponse(body, content_type="text/calendar; charset=utf-8")
    response["Content-Disposition"] = 'inline; filename="labportal-bookings.ics"'
    response["Cache-Control"] = "private, max-age=300"
    return response

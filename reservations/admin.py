from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from core.errors import DomainError
from reservations.models import BookingRule, Reservation, ReservationSlot


class ReservationSlotInline(admin.TabularInline[ReservationSlot, Reservation]):
    model = ReservationSlot
    extra = 0
    can_delete = False
    readonly_fields = ["gpu", "start", "end", "live"]

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Reservation)
class ReservationAdmin(admin.ModelAdmin[Reservation]):
    list_display = ["id", "user", "start", "end", "state", "is_maintenance", "charged", "no_show"]
    list_filter = ["state", "is_maintenance", "no_show"]
    search_fields = ["user__username", "note"]
    date_hierarchy = "start"
    inlines = [ReservationSlotInline]
    # Bookings change only through the services, which keep slots and credits in step.
    readonly_fields = [
        "user",
        "start",
        "end",
        "state",
        "is_maintenance",
        "credit_rate",
        "charged",
        "booked_end",
        "activated_at",
        "end_warned_at",
        "ended_at",
        "no_show_checked_at",
        "no_show",
        "created_at",
    ]
    fields = ["note", *readonly_fields]
    actions = ["cancel_or_release"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description=_("Cancel (or release, if running) with refund"))
    def cancel_or_release(self, request: HttpRequest, queryset: QuerySet[Reservation]) -> None:
        from reservations.services import reservation_release_early

        for reservation in queryset.filter(state__in=Reservation.LIVE_STATES):
            try:
                reservation_release_early(reservation_id=reservation.pk, actor=request.user)
            except DomainError as error:
                self.message_user(request, f"{reservation}: {error.message}", messages.ERROR)


@admin.register(BookingRule)
class BookingRuleAdmin(admin.ModelAdmin[BookingRule]):
    list_display = [
        "category",
        "max_gpus_per_booking",
        "min_length_minutes",
        "max_length_hours",
        "granularity_minutes",
        "end_policy",
        "warn_before_end_minutes",
    ]

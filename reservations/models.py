"""Time: GPU bookings on the calendar."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _


class ReservationQuerySet(models.QuerySet["Reservation"]):
    def live(self) -> ReservationQuerySet:
        """Bookings that still hold their GPUs (not cancelled, not released)."""
        return self.filter(state__in=[Reservation.State.BOOKED, Reservation.State.ACTIVE])

    def overlapping(self, *, gpu_ids: list[int], start: datetime, end: datetime) -> ReservationQuerySet:
        return self.live().filter(gpus__in=gpu_ids, start__lt=end, end__gt=start).distinct()


class Reservation(models.Model):
    """A booking of whole GPUs for [start, end)."""

    class State(models.TextChoices):
        BOOKED = "booked", _("booked")
        ACTIVE = "active", _("active")
        COMPLETED = "completed", _("completed")
        RELEASED = "released", _("released early")
        CANCELLED = "cancelled", _("cancelled")

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="reservations"
    )
    gpus = models.ManyToManyField("cluster.Gpu", related_name="reservations")
    start = models.DateTimeField(_("start"))
    end = models.DateTimeField(_("end"))
    state = models.CharField(_("state"), max_length=16, choices=State.choices, default=State.BOOKED)
    note = models.CharField(_("note"), max_length=200, blank=True)
    is_maintenance = models.BooleanField(_("maintenance"), default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ReservationQuerySet.as_manager()

    class Meta:
        verbose_name = _("reservation")
        verbose_name_plural = _("reservations")
        ordering = ["start"]
        constraints = [
            models.CheckConstraint(condition=models.Q(end__gt=models.F("start")), name="reservation_ends_after_start"),
        ]

    def __str__(self) -> str:
        return f"{self.user} {self.start:%Y-%m-%d %H:%M}–{self.end:%H:%M}"

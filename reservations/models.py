"""Time: GPU bookings on the calendar."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import DateTimeRangeField, RangeBoundary, RangeOperators
from django.core.validators import MinValueValidator
from django.db import models
from django.utils.translation import gettext_lazy as _

from core.tokens import digests_match, keyed_digest

# The id part of a calendar-feed URL token: ASCII digits only, at most a bigint.
FEED_ID = re.compile(r"[1-9][0-9]{0,17}")


class ReservationQuerySet(models.QuerySet["Reservation"]):
    def live(self) -> ReservationQuerySet:
        """Bookings that still hold their GPUs (not cancelled, not released)."""
        return self.filter(state__in=[Reservation.State.BOOKED, Reservation.State.ACTIVE])

    def overlapping(
        self, *, gpu_ids: list[int], start: datetime, end: datetime
    ) -> ReservationQuerySet:
        return self.live().filter(gpus__in=gpu_ids, start__lt=end, end__gt=start).distinct()

    def for_user(self, user: Any) -> ReservationQuerySet:
        """What `user` may see: everything for staff, else their own bookings."""
        return self if user.is_staff else self.filter(user=user)

    def counted_against_quota(self) -> ReservationQuerySet:
        """Bookings whose hours count towards the weekly cap (released ones count what they used)."""
        return self.exclude(state=Reservation.State.CANCELLED).filter(is_maintenance=False)


class Reservation(models.Model):
    """A booking of whole GPUs for [start, end)."""

    class State(models.TextChoices):
        BOOKED = "booked", _("booked")
        ACTIVE = "active", _("active")
        COMPLETED = "completed", _("completed")
        RELEASED = "released", _("released early")
        CANCELLED = "cancelled", _("cancelled")

    LIVE_STATES = (State.BOOKED, State.ACTIVE)

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
    # Credits: the rate is fixed at booking, so later refunds use the price that was paid.
    credit_rate = models.DecimalField(
        _("credits per GPU-hour"), max_digits=10, decimal_places=4, default=Decimal("0")
    )
    charged = models.DecimalField(
        _("credits charged (net)"), max_digits=14, decimal_places=4, default=Decimal("0")
    )
    booked_end = models.DateTimeField(
        _("booked end"), null=True, blank=True, help_text=_("The end before an early release.")
    )
    # Boundary bookkeeping: each is claimed once by the beat tick (filter(...).update(...)).
    activated_at = models.DateTimeField(_("activated at"), null=True, blank=True)
    end_warned_at = models.DateTimeField(_("end warning sent at"), null=True, blank=True)
    ended_at = models.DateTimeField(_("ended at"), null=True, blank=True)
    no_show_checked_at = models.DateTimeField(null=True, blank=True)
    no_show = models.BooleanField(_("no-show"), default=False)

    objects = ReservationQuerySet.as_manager()

    class Meta:
        verbose_name = _("reservation")
        verbose_name_plural = _("reservations")
        ordering = ["start"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(end__gt=models.F("start")), name="reservation_ends_after_start"
            ),
        ]
        indexes = [models.Index(fields=["state", "start"]), models.Index(fields=["state", "end"])]

    def __str__(self) -> str:
        return f"{self.user} {self.start:%Y-%m-%d %H:%M}–{self.end:%H:%M}"

    @property
    def is_live(self) -> bool:
        return self.state in self.LIVE_STATES

    @property
    def duration(self) -> timedelta:
        return self.end - self.start

    def gpu_hours(self) -> Decimal:
        return gpu_hours(self.gpus.count(), self.end - self.start)

    def can_cancel(self, now: datetime) -> bool:
        return self.state == self.State.BOOKED and self.start > now

    def can_release(self, now: datetime) -> bool:
        return self.is_live and self.start <= now < self.end

    def can_extend(self, now: datetime) -> bool:
        return self.is_live and self.end > now


def gpu_hours(gpu_count: int, length: timedelta) -> Decimal:
    return (Decimal(gpu_count) * Decimal(int(length.total_seconds())) / Decimal(3600)).quantize(
        Decimal("0.0001")
    )


class TsTzRange(models.Func):
    function = "TSTZRANGE"
    output_field = DateTimeRangeField()


class ReservationSlot(models.Model):
    """One GPU of one reservation over its time range: the row the exclusion constraint guards.

    `Reservation.gpus` stays the public relation; a slot row per GPU exists so that
    PostgreSQL can refuse two live bookings of one GPU whose ranges overlap, even
    when two transactions race. On SQLite the service checks inside its transaction.
    """

    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="slots")
    gpu = models.ForeignKey(
        "cluster.Gpu", on_delete=models.CASCADE, related_name="reservation_slots"
    )
    start = models.DateTimeField()
    end = models.DateTimeField()
    live = models.BooleanField(default=True)

    class Meta:
        verbose_name = _("reserved GPU slot")
        verbose_name_plural = _("reserved GPU slots")
        constraints = [
            models.UniqueConstraint(
                fields=["reservation", "gpu"], name="reservation_slot_gpu_once"
            ),
            models.CheckConstraint(
                condition=models.Q(end__gt=models.F("start")),
                name="reservation_slot_ends_after_start",
            ),
            # Created on PostgreSQL only (see migration 0002); [start, end) ranges.
            ExclusionConstraint(
                name="reservation_slot_no_overlap",
                expressions=[
                    ("gpu", RangeOperators.EQUAL),
                    (TsTzRange("start", "end", RangeBoundary()), RangeOperators.OVERLAPS),
                ],
                condition=models.Q(live=True),
            ),
        ]

    def __str__(self) -> str:
        return (
            f"{self.reservation_id} gpu {self.gpu_id} {self.start:%Y-%m-%d %H:%M}–{self.end:%H:%M}"
        )


class BookingRule(models.Model):
    """Booking rules of a category beyond the weekly cap and the horizon kept on Category."""

    class EndPolicy(models.TextChoices):
        WARN = "warn", _("warn only: jobs keep running after the slot")
        STOP = "stop", _("stop jobs at the end of the slot")

    category = models.OneToOneField(
        "accounts.Category",
        verbose_name=_("category"),
        on_delete=models.CASCADE,
        related_name="booking_rule",
    )
    max_gpus_per_booking = models.PositiveIntegerField(
        _("max GPUs per booking"), default=4, validators=[MinValueValidator(1)]
    )
    min_length_minutes = models.PositiveIntegerField(
        _("minimum length (minutes)"), default=30, validators=[MinValueValidator(1)]
    )
    max_length_hours = models.PositiveIntegerField(
        _("maximum length (hours)"), default=24, validators=[MinValueValidator(1)]
    )
    granularity_minutes = models.PositiveIntegerField(
        _("slot granularity (minutes)"),
        default=30,
        validators=[MinValueValidator(1)],
        help_text=_("Start and end must fall on multiples of this, counted from midnight."),
    )
    end_policy = models.CharField(
        _("at the end of a slot"), max_length=8, choices=EndPolicy.choices, default=EndPolicy.WARN
    )
    warn_before_end_minutes = models.PositiveIntegerField(
        _("warn this many minutes before the end"), default=15
    )

    class Meta:
        verbose_name = _("booking rule")
        verbose_name_plural = _("booking rules")

    def __str__(self) -> str:
        return str(self.category)

    @classmethod
    def for_user(cls, user: Any) -> BookingRules:
        """The rules that apply to `user`, with defaults where the category has none."""
        category = getattr(user, "category", None)
        found = (
            BookingRule.objects.filter(category=category).first() if category is not None else None
        )
        rule: BookingRule = found or BookingRule()
        return BookingRules(
            max_gpus_per_booking=rule.max_gpus_per_booking,
            min_length=timedelta(minutes=rule.min_length_minutes),
            max_length=timedelta(hours=rule.max_length_hours),
            granularity=timedelta(minutes=rule.granularity_minutes),
            end_policy=rule.end_policy,
            warn_before_end=timedelta(minutes=rule.warn_before_end_minutes),
            max_gpu_hours_per_week=Decimal(category.max_booked_hours_per_week if category else 48),
            max_days_ahead=category.max_booking_days_ahead if category else 14,
        )


@dataclass(frozen=True)
class BookingRules:
    """Every booking rule for one member, merged from Category and BookingRule."""

    max_gpus_per_booking: int
    min_length: timedelta
    max_length: timedelta
    granularity: timedelta
    end_policy: str
    warn_before_end: timedelta
    max_gpu_hours_per_week: Decimal
    max_days_ahead: int

    @property
    def granularity_minutes(self) -> int:
        return int(self.granularity.total_seconds() // 60)


class CalendarFeed(models.Model):
    """The per-user secret behind the iCal subscription URL; resetting it revokes old URLs.

    The row keeps only ``secret``, which is never shown. The URL's token is
    ``<id>.<HMAC-SHA256 of SECRET_KEY over the id and the secret>``, so the page and the
    API can show the same URL every time, while a copy of the database without
    SECRET_KEY cannot produce a working one.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="calendar_feed"
    )
    secret = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = _("calendar feed")
        verbose_name_plural = _("calendar feeds")

    def __str__(self) -> str:
        return str(self.user)

    @staticmethod
    def new_secret() -> str:
        return secrets.token_urlsafe(32)

    @classmethod
    def for_user(cls, user: Any) -> CalendarFeed:
        feed, _created = cls.objects.get_or_create(user=user, defaults={"secret": cls.new_secret()})
        return feed

    def reset(self) -> None:
        """A new secret: the old URL stops working."""
        self.secret = self.new_secret()
        self.save(update_fields=["secret"])

    def _digest(self, key: str) -> str:
        return keyed_digest(key, "reservations.CalendarFeed", str(self.pk), self.secret)

    @property
    def url_token(self) -> str:
        """What goes into the iCal URL: ``<id>.<digest>``."""
        return f"{self.pk}.{self._digest(str(settings.SECRET_KEY))}"

    @classmethod
    def from_url_token(cls, token: str) -> CalendarFeed | None:
        """The feed whose URL carries ``token``, or None (unknown id or wrong digest).

        A digest made with one of SECRET_KEY_FALLBACKS is still accepted, so that URLs
        keep working while the key is rotated, as Django's own signatures do.
        """
        feed_id, dot, digest = token.partition(".")
        if not dot or not FEED_ID.fullmatch(feed_id):
            return None
        feed = cls.objects.filter(pk=int(feed_id)).select_related("user").first()
        if feed is None:
            return None
        keys: list[str] = [str(settings.SECRET_KEY), *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
        if any(digests_match(digest, feed._digest(key)) for key in keys):
            return feed
        return None

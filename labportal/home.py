"""What the member's home page gathers: their jobs, next booking, credits, and the lab today."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Avg, Count, Q
from django.utils import timezone

from accounts.models import PersonalAccessToken
from accounts.selectors import CreditSummary, credit_summary
from cluster.models import Gpu
from jobqueue.models import Job
from reservations.models import Reservation
from telemetry.selectors import LabDay, lab_daily


@dataclass(frozen=True)
class LabNow:
    gpus: int
    gpus_allocated: int
    util_now: float | None
    today: LabDay | None


@dataclass(frozen=True)
class Home:
    running: list[Job]
    waiting: list[Job]
    next_booking: Reservation | None
    credits: CreditSummary
    lab: LabNow
    new_member: bool
    has_token: bool


def home_for(user: Any, *, now: datetime | None = None) -> Home:
    """Everything the personal dashboard shows, in a fixed handful of queries."""
    now = now or timezone.now()
    mine = Job.objects.filter(owner=user).select_related("queue", "node")
    running = list(mine.filter(state__in=Job.ACTIVE_STATES).order_by("started_at"))
    waiting = list(
        mine.filter(state__in=Job.WAITING_STATES).order_by("queue_position", "submitted_at")
    )
    next_booking = (
        Reservation.objects.filter(
            user=user, state__in=Reservation.LIVE_STATES, end__gt=now, is_maintenance=False
        )
        .prefetch_related("gpus__node")
        .order_by("start")
        .first()
    )
    whole = Gpu.objects.filter(kind=Gpu.Kind.WHOLE).exclude(state=Gpu.State.MISSING)
    fresh = now - timedelta(minutes=2)
    figures = whole.aggregate(
        gpus=Count("pk", distinct=True),
        # The portal's allocations, and in Slurm mode the GPUs Slurm has given its jobs.
        allocated=Count("pk", filter=Q(allocations__active=True) | ~Q(held_by=""), distinct=True),
        util=Avg("util_pct", filter=Q(sampled_at__gte=fresh)),
    )
    today = lab_daily(
        start=timezone.localdate(now), end=timezone.localdate(now) + timedelta(days=1)
    )
    return Home(
        running=running,
        waiting=waiting,
        next_booking=next_booking,
        credits=credit_summary(user, now=now),
        lab=LabNow(
            gpus=figures["gpus"],
            gpus_allocated=figures["allocated"],
            util_now=figures["util"],
            today=today[0] if today and today[0].util_mean is not None else None,
        ),
        new_member=not mine.exists(),
        has_token=PersonalAccessToken.objects.filter(user=user, revoked_at__isnull=True).exists(),
    )

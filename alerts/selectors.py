"""Reads of alerts shared by the pages and the API."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Case, IntegerField, Value, When
from django.utils import timezone

from accounts.models import User
from alerts.models import Alert, AlertQuerySet

RECENT_DAYS = 7


def alerts_visible_to(user: User) -> AlertQuerySet:
    """Staff see every alert; a member sees the alerts about their own jobs."""
    qs = Alert.objects.select_related("job", "gpu", "gpu__node", "node", "acknowledged_by")
    return qs if user.is_staff else qs.filter(user=user, job__isnull=False)


def alerts_for_staff_page(*, state: str | None = None) -> AlertQuerySet:
    """Open alerts first (firing before acknowledged), then those resolved in the last week."""
    qs = Alert.objects.select_related("job", "gpu", "gpu__node", "node", "acknowledged_by")
    if state:
        qs = qs.filter(state=state)
    else:
        qs = qs.exclude(
            state=Alert.State.RESOLVED,
            resolved_at__lt=timezone.now() - timedelta(days=RECENT_DAYS),
        )
    return qs.annotate(
        open_rank=Case(
            When(state=Alert.State.FIRING, then=Value(0)),
            When(state=Alert.State.ACKNOWLEDGED, then=Value(1)),
            default=Value(2),
            output_field=IntegerField(),
        )
    ).order_by("open_rank", "-fired_at", "-id")


def alerts_for_job(*, job_id: int) -> AlertQuerySet:
    return Alert.objects.filter(job_id=job_id).order_by("-fired_at")

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import template

from core.durations import hours_minutes as _hours_minutes
from jobqueue.models import Job

register = template.Library()


@register.filter
def hours_minutes(value: float | int | timedelta | None) -> str:
    """A time limit or a run time as hours and minutes: `{{ job.time_limit_s|hours_minutes }}`."""
    return _hours_minutes(value)


@register.filter
def pending_reason_for(job: Job, reader: Any) -> str:
    """Why a job waits, worded for the reader (`you` only to its owner)."""
    return job.pending_reason_text_for(getattr(reader, "pk", None))

"""Lengths of time as people read them: hours and minutes, never a bare count of seconds."""

from __future__ import annotations

from datetime import timedelta

from django.utils.functional import lazy
from django.utils.translation import gettext as _


def hours_minutes(seconds: float | int | timedelta | None) -> str:
    """`4 h`, `1 h 30 min`, `45 min`; under a minute, seconds (`20 s`)."""
    if seconds is None:
        return ""
    if isinstance(seconds, timedelta):
        seconds = seconds.total_seconds()
    total = max(0, int(seconds))
    if total < 60:
        return _("%(n)d s") % {"n": total}
    hours, rest = divmod(total, 3600)
    minutes = rest // 60
    if hours and minutes:
        return _("%(h)d h %(m)d min") % {"h": hours, "m": minutes}
    if hours:
        return _("%(n)d h") % {"n": hours}
    return _("%(n)d min") % {"n": minutes}


lazy_hours_minutes = lazy(hours_minutes, str)

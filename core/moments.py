"""Moments in messages read away from the page (notifications, emails, refusals): in the
lab's time zone, saying which, since a reader elsewhere cannot tell it from the text."""

from __future__ import annotations

from datetime import datetime

from django.utils import formats, timezone


def when_with_zone(moment: datetime) -> str:
    """`2026-12-02 05:08 UTC`, `2026年12月2日 13:08 CST`: the short date and time of the
    active language, then the zone's abbreviation."""
    local = timezone.localtime(moment)
    return f"{formats.date_format(local, 'SHORT_DATETIME_FORMAT')} {local.tzname()}"

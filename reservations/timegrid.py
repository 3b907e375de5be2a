"""The booking grid: slot boundaries counted from local midnight, and ISO weeks."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from django.utils import timezone


def _local_midnight(moment: datetime) -> datetime:
    local = timezone.localtime(moment)
    return local.replace(hour=0, minute=0, second=0, microsecond=0)


def is_on_grid(moment: datetime, granularity: timedelta) -> bool:
    offset = timezone.localtime(moment) - _local_midnight(moment)
    return offset.total_seconds() % granularity.total_seconds() == 0


def ceil_to_grid(moment: datetime, granularity: timedelta) -> datetime:
    midnight = _local_midnight(moment)
    steps = math.ceil((timezone.localtime(moment) - midnight) / granularity)
    return midnight + steps * granularity


def floor_to_grid(moment: datetime, granularity: timedelta) -> datetime:
    midnight = _local_midnight(moment)
    steps = math.floor((timezone.localtime(moment) - midnight) / granularity)
    return midnight + steps * granularity


def week_start(moment: datetime) -> datetime:
    """Local Monday 00:00 of the week that holds `moment`."""
    midnight = _local_midnight(moment)
    return midnight - timedelta(days=midnight.weekday())


def weeks_touching(start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
    weeks = []
    monday = week_start(start)
    while monday < end:
        next_monday = week_start(monday + timedelta(days=7, hours=12))
        weeks.append((monday, next_monday))
        monday = next_monday
    return weeks


def overlap(a_start: datetime, a_end: datetime, b_start: datetime, b_end: datetime) -> timedelta:
    return max(timedelta(0), min(a_end, b_end) - max(a_start, b_start))

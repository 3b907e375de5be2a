"""Parsing what people type: durations (2h, 90m, 1h30m, 3600), sizes (16G, 512M) and times."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from datetime import date, datetime, timedelta
from typing import TypeVar

T = TypeVar("T")

_DURATION_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}
# A part starts only where no digit or point comes before it: a long run of digits is
# then tried once, not from each of its digits (which made findall quadratic).
_DURATION_PART = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*(d|hr|h|min|m|sec|s)")

_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)$", re.IGNORECASE)
_SIZE_TO_MIB = {"": 1, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


def parse_duration(text: str) -> int:
    """Seconds from '3600', '90m', '2h', '1h30m', '1.5h', '2d', '45s' (a bare number is seconds)."""
    value = text.strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+", value):
        seconds = int(value)
    else:
        parts = _DURATION_PART.findall(value)
        if not value or "".join(n + u for n, u in parts) != value:
            raise ValueError(
                f"“{text}” is not a duration; use e.g. 3600 (seconds), 90m, 2h, 1h30m or 1d."
            )
        seconds = round(sum(float(n) * _DURATION_UNITS[u] for n, u in parts))
    if seconds <= 0:
        raise ValueError(f"“{text}” is not a positive duration.")
    return seconds


def parse_size_mb(text: str) -> int:
    """MiB from '16G', '16GiB', '512M', '1.5g', '2T', '65536K'; a bare number is MiB. G means GiB (1024 MiB)."""
    match = _SIZE.match(text.strip())
    if not match:
        raise ValueError(
            f"“{text}” is not a size; use e.g. 16G, 512M or 40GiB (a bare number is MiB)."
        )
    number, unit, _suffix = match.groups()
    mib = float(number) * _SIZE_TO_MIB[unit.lower()]
    if mib <= 0:
        raise ValueError(f"“{text}” is not a positive size.")
    return max(1, round(mib))


def parse_env(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"“{text}” is not KEY=VALUE (e.g. --env EPOCHS=10).")
    return key, value


MAX_ARRAY = 1000  # the portal's (jobqueue.arrays.MAX_ARRAY); a test holds the two together


def parse_array(text: str) -> list[int]:
    """Array indices: "0-9", "1,4,7" or a mix ("0-3,10"); each at most once, in order."""
    indices: list[int] = []
    for part in text.split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"“{text}” is not an array range: use 0-9, 1,4,7 or 0-3,10.")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ValueError(f"“{part}” counts down; write it as {last}-{first}.")
        indices.extend(range(first, last + 1))
        if len(indices) > MAX_ARRAY:
            raise ValueError(f"An array holds at most {MAX_ARRAY} jobs; “{text}” has more.")
    return list(dict.fromkeys(indices))


def array_text(indices: list[int]) -> str:
    """Indices as an array spec again, runs of consecutive ones as ranges: 0-2,7."""
    parts: list[str] = []
    start = previous = None
    for index in [*indices, None]:
        if previous is not None and index == previous + 1:
            previous = index
            continue
        if start is not None:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = index
    return ",".join(parts)


MAX_DEPENDENCIES = 64  # the portal's (jobqueue.dependencies); a test holds the two together
_DEPENDENCY = re.compile(r"^(afterok|afterany)((?::\d+)+)$")


def parse_dependency(text: str) -> str:
    """Slurm's syntax, checked before sending: "afterok:12:13" or "afterany:12"."""
    value = text.strip().lower()
    match = _DEPENDENCY.match(value)
    if match is None:
        raise ValueError(
            f"“{text}” is not a dependency: write afterok:12:13 (after jobs 12 and 13 "
            "completed) or afterany:12 (after job 12 ended, however)."
        )
    ids = list(dict.fromkeys(match.group(2).split(":")[1:]))
    if len(ids) > MAX_DEPENDENCIES:
        raise ValueError(
            f"A job may depend on at most {MAX_DEPENDENCIES} jobs; “{text}” names {len(ids)}."
        )
    return ":".join([match.group(1), *ids])


def parse_when(text: str, *, now: datetime | None = None) -> datetime:
    """An aware datetime from '2026-12-01 14:00', ISO 8601, 'today 14:00' or 'tomorrow 9:30'.

    Times without an offset are in this computer's local time zone.
    """
    now = now or datetime.now().astimezone()
    value = text.strip()
    relative = re.fullmatch(r"(today|tomorrow)\s+(\d{1,2}):(\d{2})", value, re.IGNORECASE)
    if relative:
        day: date = now.date() + timedelta(days=1 if relative.group(1).lower() == "tomorrow" else 0)
        hour, minute = int(relative.group(2)), int(relative.group(3))
        if hour > 23 or minute > 59:
            raise ValueError(f"“{text}” is not a time of day.")
        moment = datetime(day.year, day.month, day.day, hour, minute)
    else:
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(
                f'“{text}” is not a date and time; use e.g. "2026-12-01 14:00" or "tomorrow 9:30".'
            ) from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # local time of this computer
    return moment


def parse_hours(text: str) -> float:
    """Hours as a number ('2', '1.5') or a duration ('90m', '1h30m')."""
    try:
        hours = float(text)
    except ValueError:
        hours = parse_duration(text) / 3600
    if hours <= 0:
        raise ValueError(f"“{text}” is not a positive number of hours.")
    return hours


def parse_count(text: str) -> int:
    """A whole number of 1 or more (how many items to list)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"“{text}” is not a whole number of 1 or more.")
    return value


def argtype(parser_fn: Callable[[str], T]) -> Callable[[str], T]:
    """Wrap a parser so argparse reports its message as a usage error (exit 2, no traceback)."""

    def convert(text: str) -> T:
        try:
            return parser_fn(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = parser_fn.__name__.removeprefix("parse_")
    return convert

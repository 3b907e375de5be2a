"""An iCalendar (RFC 5545) feed of a member's bookings, written by hand.

Text values are escaped (backslash, semicolon, comma, newline), content lines are
folded at 75 octets without splitting a UTF-8 character, and lines end in CRLF.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from django.utils.translation import gettext as _

from reservations.models import Reservation

MAX_OCTETS = 75


def escape_text(value: str) -> str:
    return (
        value.replace("\\", "\\\\")
        .replace(";", "\\;")
        .replace(",", "\\,")
        .replace("\r\n", "\\n")
        .replace("\n", "\\n")
        .replace("\r", "\\n")
    )


def fold(line: str) -> str:
    """Splits a content line into chunks of at most 75 octets; continuations start with a space."""
    chunks: list[str] = []
    current, size = "", 0
    limit = MAX_OCTETS
    for char in line:
        width = len(char.encode("utf-8"))
        if size + width > limit:
            chunks.append(current)
            current, size = "", 0
            limit = MAX_OCTETS - 1  # the leading space of a continuation counts
        current += char
        size += width
    chunks.append(current)
    return "\r\n ".join(chunks)


def utc_stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


def calendar_for(
    reservations: Iterable[Reservation], *, name: str, host: str, now: datetime, link: str = ""
) -> str:
    lines = [
        "BEGIN:VCALENDAR",
        "VERSION:2.0",
        "PRODID:-//LabPortal//Reservations//EN",
        "CALSCALE:GREGORIAN",
        "METHOD:PUBLISH",
        f"X-WR-CALNAME:{escape_text(name)}",
    ]
    for reservation in reservations:
        labels = ", ".join(g.label for g in reservation.gpus.all())
        summary = (
            _("Maintenance: %(gpus)s") if reservation.is_maintenance else _("GPU booking: %(gpus)s")
        ) % {"gpus": labels}
        description = "\n".join(
            part
            for part in (
                _("State: %(state)s") % {"state": reservation.get_state_display()},
                reservation.note,
            )
            if part
        )
        lines += [
            "BEGIN:VEVENT",
            f"UID:reservation-{reservation.pk}@{host}",
            f"DTSTAMP:{utc_stamp(now)}",
            f"CREATED:{utc_stamp(reservation.created_at)}",
            f"DTSTART:{utc_stamp(reservation.start)}",
            f"DTEND:{utc_stamp(reservation.end)}",
            f"SUMMARY:{escape_text(summary)}",
            f"DESCRIPTION:{escape_text(description)}",
            "STATUS:"
            + ("CANCELLED" if reservation.state == Reservation.State.CANCELLED else "CONFIRMED"),
            "TRANSP:OPAQUE",
        ]
        if link:
            lines.append(f"URL:{link}")
        lines.append("END:VEVENT")
    lines.append("END:VCALENDAR")
    return "".join(fold(line) + "\r\n" for line in lines)

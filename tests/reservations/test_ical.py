"""The iCal feed parses under a strict RFC 5545 reader."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest
from django.test import Client

from reservations.ical import fold
from reservations.models import CalendarFeed
from reservations.services import reservation_cancel, reservation_create
from tests.reservations.conftest import at

pytestmark = pytest.mark.django_db

NAME = r"[A-Za-z0-9-]+"
PARAM = rf"{NAME}=(?:\"[^\"]*\"|[^\";:,]*)(?:,(?:\"[^\"]*\"|[^\";:,]*))*"
CONTENT_LINE = re.compile(rf"^(?P<name>{NAME})(?P<params>(?:;{PARAM})*):(?P<value>.*)$")


def unescape(value: str) -> str:
    out, i = [], 0
    while i < len(value):
        char = value[i]
        if char == "\\":
            nxt = value[i + 1]
            assert nxt in "\\;,nN", f"bad escape \\{nxt}"
            out.append("\n" if nxt in "nN" else nxt)
            i += 2
            continue
        assert char not in ";,", f"unescaped {char!r} in TEXT value {value!r}"
        out.append(char)
        i += 1
    return "".join(out)


def parse_ics(raw: bytes) -> list[dict[str, str]]:
    """A strict reader: CRLF only, folded lines of at most 75 octets, balanced components."""
    assert raw.endswith(b"\r\n")
    assert b"\n" not in raw.replace(b"\r\n", b"")
    physical = raw[:-2].split(b"\r\n")
    for octets in physical:
        assert len(octets) <= 75, f"line over 75 octets: {octets!r}"
        octets.decode("utf-8")  # folding never splits a character
    logical: list[str] = []
    for line in (p.decode("utf-8") for p in physical):
        if line.startswith((" ", "\t")):
            logical[-1] += line[1:]
        else:
            logical.append(line)
    stack: list[str] = []
    events: list[dict[str, str]] = []
    calendar_props: dict[str, str] = {}
    for line in logical:
        match = CONTENT_LINE.match(line)
        assert match, f"not a content line: {line!r}"
        name, value = match["name"].upper(), match["value"]
        if name == "BEGIN":
            stack.append(value)
            if value == "VEVENT":
                events.append({})
            continue
        if name == "END":
            assert stack and stack.pop() == value, f"unbalanced END:{value}"
            continue
        target = events[-1] if stack and stack[-1] == "VEVENT" else calendar_props
        assert name not in target, f"{name} twice"
        target[name] = (
            unescape(value) if name in {"SUMMARY", "DESCRIPTION", "X-WR-CALNAME"} else value
        )
    assert stack == []
    assert logical[0] == "BEGIN:VCALENDAR" and logical[-1] == "END:VCALENDAR"
    assert calendar_props["VERSION"] == "2.0" and calendar_props["PRODID"]
    for event in events:
        for required in ("UID", "DTSTAMP", "DTSTART", "DTEND"):
            assert required in event
        for stamp in ("DTSTAMP", "DTSTART", "DTEND"):
            assert re.fullmatch(r"\d{8}T\d{6}Z", event[stamp])
    return events


def stamp(value: str) -> datetime:
    return datetime.strptime(value, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)


def test_the_feed_lists_bookings_and_parses(
    alice: Any, bob: Any, gpus: list[Any], contracts: Any, clock: Any
) -> None:
    tricky = "résumé run; ablation, \\ 第二轮\nline two " + "long " * 20
    first = reservation_create(
        user=alice, gpu_ids=[gpus[0].pk, gpus[1].pk], start=at(1), end=at(3), note=tricky
    )
    second = reservation_create(user=alice, gpu_ids=[gpus[2].pk], start=at(5), end=at(6))
    reservation_cancel(reservation_id=second.pk, actor=alice)
    reservation_create(user=bob, gpu_ids=[gpus[3].pk], start=at(1), end=at(2))
    token = CalendarFeed.for_user(alice).token

    response = Client().get(f"/reservations/ical/{token}.ics")  # no session
    assert response.status_code == 200
    assert response["Content-Type"] == "text/calendar; charset=utf-8"
    events = parse_ics(response.content)
    assert len(events) == 2  # bob's is not there
    by_uid = {e["UID"]: e for e in events}
    event = by_uid[f"reservation-{first.pk}@testserver"]
    assert stamp(event["DTSTART"]) == at(1) and stamp(event["DTEND"]) == at(3)
    assert event["SUMMARY"] == "GPU booking: gpu01/gpu0, gpu01/gpu1"
    assert event["DESCRIPTION"] == "State: booked\n" + tricky
    assert event["STATUS"] == "CONFIRMED"
    assert by_uid[f"reservation-{second.pk}@testserver"]["STATUS"] == "CANCELLED"


def test_a_wrong_or_reset_token_gets_404(alice: Any, clock: Any) -> None:
    feed = CalendarFeed.for_user(alice)
    old = feed.token
    assert Client().get("/reservations/ical/not-the-token.ics").status_code == 404
    feed.reset()
    assert Client().get(f"/reservations/ical/{old}.ics").status_code == 404
    assert Client().get(f"/reservations/ical/{feed.token}.ics").status_code == 200


def test_folding_never_splits_a_character() -> None:
    line = "DESCRIPTION:" + "第" * 60
    folded = fold(line).encode("utf-8").split(b"\r\n")
    assert all(len(part) <= 75 for part in folded)
    assert "".join(p.decode()[1:] if i else p.decode() for i, p in enumerate(folded)) == line

"""The iCal feed parses under a strict RFC 5545 reader."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client, override_settings

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
    token = CalendarFeed.for_user(alice).url_token

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
    old = feed.url_token
    assert Client().get("/reservations/ical/not-the-token.ics").status_code == 404
    feed.reset()
    assert feed.url_token != old
    assert Client().get(f"/reservations/ical/{old}.ics").status_code == 404
    assert Client().get(f"/reservations/ical/{feed.url_token}.ics").status_code == 200


def test_the_database_row_holds_nothing_that_is_in_the_url(alice: Any, clock: Any) -> None:
    feed = CalendarFeed.for_user(alice)
    client = Client()
    client.force_login(alice)
    page_url = client.get("/reservations/mine/").context["feed_url"]
    api_url = client.get("/api/reservations/feed/").json()["url"]
    assert page_url == api_url == client.get("/api/reservations/feed/").json()["url"]
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT * FROM {CalendarFeed._meta.db_table} WHERE id = %s",
            [feed.pk],
        )
        row = cursor.fetchone()
    digest = feed.url_token.split(".", 1)[1]
    assert len(digest) == 43  # 32 bytes of HMAC-SHA256, base64 without padding
    for value in row:
        text = str(value)
        assert digest not in text
        if len(text) >= 8:  # the id is in the URL by design; nothing secret is
            assert text not in page_url
    # Without SECRET_KEY the row does not give the URL: another key, another digest.
    token = feed.url_token
    with override_settings(SECRET_KEY="some-other-key-" + "x" * 40):
        assert CalendarFeed.objects.get(pk=feed.pk).url_token != token


def not_found_page(response: Any) -> str:
    """The 404 page less what differs per request: CSRF tokens and the path in `next`."""
    text = response.content.decode()
    text = re.sub(r'(X-CSRFToken": "|name="csrfmiddlewaretoken" value=")[^"]*', r"\1", text)
    return re.sub(r'(name="next" type="hidden" value=")[^"]*', r"\1", text)


def test_a_wrong_digest_or_unknown_id_gets_the_same_404(alice: Any, bob: Any, clock: Any) -> None:
    feed = CalendarFeed.for_user(alice)
    other = CalendarFeed.for_user(bob)
    feed_id, digest = feed.url_token.split(".")
    flipped = ("A" if digest[0] != "A" else "B") + digest[1:]
    with override_settings(SECRET_KEY="some-other-key-" + "x" * 40):
        foreign = CalendarFeed.objects.get(pk=feed.pk).url_token
    assert Client().get(f"/reservations/ical/{feed.url_token}.ics").status_code == 200
    baseline = Client().get("/reservations/ical/not-the-token.ics")
    assert baseline.status_code == 404
    for token in (
        f"{feed_id}.{flipped}",  # wrong HMAC
        f"{feed_id}.{digest[:-1]}",  # truncated
        f"{feed_id}.{digest}A",  # extended
        f"{feed_id}.",
        f"{feed_id}",
        f"{other.pk}.{digest}",  # alice's digest on bob's id
        f"{feed.pk + other.pk + 1000}.{digest}",  # unknown id
        f"0.{digest}",
        f"0{feed_id}.{digest}",
        "\N{SUPERSCRIPT TWO}." + digest,  # a Unicode digit
        f"{feed_id}.{digest}.{digest}",
        foreign,  # made with another SECRET_KEY
        feed.secret,  # what the database holds
        f"{feed_id}.{feed.secret}",
    ):
        response = Client().get(f"/reservations/ical/{token}.ics")
        assert response.status_code == 404, token
        assert not_found_page(response) == not_found_page(baseline), token


def test_resetting_on_the_page_revokes_the_old_url(alice: Any, clock: Any) -> None:
    client = Client()
    client.force_login(alice)
    old = client.get("/api/reservations/feed/").json()["url"]
    secret = CalendarFeed.objects.get(user=alice).secret
    assert client.get(old).status_code == 200
    assert client.post("/reservations/feed/reset/").status_code == 302
    new = client.get("/api/reservations/feed/").json()["url"]
    assert new != old and CalendarFeed.objects.get(user=alice).secret != secret
    assert Client().get(old).status_code == 404
    assert Client().get(new).status_code == 200


def test_a_url_made_with_a_fallback_secret_key_still_works(alice: Any, clock: Any) -> None:
    old_key, new_key = "old-key-" + "o" * 40, "new-key-" + "n" * 40
    with override_settings(SECRET_KEY=old_key):
        token = CalendarFeed.for_user(alice).url_token
    with override_settings(SECRET_KEY=new_key, SECRET_KEY_FALLBACKS=[old_key]):
        assert Client().get(f"/reservations/ical/{token}.ics").status_code == 200
    with override_settings(SECRET_KEY=new_key, SECRET_KEY_FALLBACKS=[]):
        assert Client().get(f"/reservations/ical/{token}.ics").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_the_migration_gives_existing_feeds_a_fresh_secret(alice: Any, bob: Any) -> None:
    """Old plaintext tokens are not kept: their URLs stop working, the new URL works."""
    before = [("reservations", "0002_slots_rules_feed_credits")]
    after = [("reservations", "0003_calendar_feed_secret")]
    executor = MigrationExecutor(connection)
    try:
        executor.migrate(before)
        old_apps = executor.loader.project_state(before).apps
        old_feed = old_apps.get_model("reservations", "CalendarFeed")
        old_feed.objects.create(user_id=alice.pk, token="alice-plaintext-token-" + "a" * 20)
        old_feed.objects.create(user_id=bob.pk, token="bob-plaintext-token-" + "b" * 20)
        assert Client().get("/reservations/ical/x.ics").status_code == 404

        executor = MigrationExecutor(connection)
        executor.migrate(after)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())

    feeds = {feed.user_id: feed for feed in CalendarFeed.objects.all()}
    assert set(feeds) == {alice.pk, bob.pk}
    secrets = {feed.secret for feed in feeds.values()}
    assert len(secrets) == 2 and all(len(secret) >= 43 for secret in secrets)
    assert not any("plaintext" in secret for secret in secrets)
    old_url = "/reservations/ical/alice-plaintext-token-" + "a" * 20 + ".ics"
    assert Client().get(old_url).status_code == 404
    new_url = f"/reservations/ical/{feeds[alice.pk].url_token}.ics"
    assert Client().get(new_url).status_code == 200


def test_folding_never_splits_a_character() -> None:
    line = "DESCRIPTION:" + "第" * 60
    folded = fold(line).encode("utf-8").split(b"\r\n")
    assert all(len(part) <= 75 for part in folded)
    assert "".join(p.decode()[1:] if i else p.decode() for i, p in enumerate(folded)) == line

"""Durations, sizes and times as people type them; bad input is a usage error, never a traceback."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from labctl.output import span
from labctl.parsing import (
    parse_count,
    parse_duration,
    parse_env,
    parse_hours,
    parse_size_mb,
    parse_when,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("3600", 3600),
        ("90m", 5400),
        ("2h", 7200),
        ("1h30m", 5400),
        ("1.5h", 5400),
        ("45s", 45),
        ("1d", 86400),
        ("2H", 7200),
        ("1h 30m", 5400),
        ("10min", 600),
    ],
)
def test_durations_accept_seconds_minutes_hours_and_days(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["3x", "", "h", "0", "-5m", "2h30", "abc"])
def test_a_duration_that_is_not_one_is_refused_with_examples(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_a_megabyte_of_digits_is_refused_as_a_duration_in_one_pass() -> None:
    # Tried from each digit, as the old pattern was, this is 10^12 / 2 steps: hours.
    with pytest.raises(ValueError, match="duration"):
        parse_duration("1" * 1_000_000 + "x")


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("16G", 16384),
        ("40GiB", 40960),
        ("512M", 512),
        ("512MB", 512),
        ("1.5g", 1536),
        ("2T", 2097152),
        ("65536K", 64),
        ("2048", 2048),
    ],
)
def test_sizes_are_converted_to_mib_with_g_meaning_gib(text: str, mib: int) -> None:
    assert parse_size_mb(text) == mib


@pytest.mark.parametrize("text", ["16X", "G", "", "0G", "lots"])
def test_a_size_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size_mb(text)


def test_env_is_split_at_the_first_equals_sign() -> None:
    assert parse_env("OPTS=a=b") == ("OPTS", "a=b")
    assert parse_env("EMPTY=") == ("EMPTY", "")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_env("NOEQUALS")


def test_hours_take_a_number_or_a_duration() -> None:
    assert parse_hours("2") == 2
    assert parse_hours("90m") == 1.5
    with pytest.raises(ValueError):
        parse_hours("-1")


def test_times_without_an_offset_are_local_and_with_one_are_kept() -> None:
    local = parse_when("2026-12-01 14:00")
    assert local.tzinfo is not None
    assert (local.hour, local.minute) == (14, 0)
    utc = parse_when("2026-12-01T14:00:00Z")
    assert utc == datetime(2026, 12, 1, 14, 0, tzinfo=UTC)


def test_tomorrow_means_the_next_local_day() -> None:
    now = datetime(2026, 11, 30, 22, 0).astimezone()
    moment = parse_when("tomorrow 9:30", now=now)
    assert moment.date() == (now + timedelta(days=1)).date()
    assert (moment.hour, moment.minute) == (9, 30)
    with pytest.raises(ValueError):
        parse_when("next tuesday")


def test_spans_read_as_people_say_them() -> None:
    assert [span(s) for s in (5, 90, 3600, 5400, 90000)] == ["5s", "1m", "1h", "1h 30m", "1d 1h"]


def test_a_bad_time_limit_on_the_command_line_exits_2_without_a_traceback(
    labctl: Callable[..., Any],
) -> None:
    result = labctl("submit", "--image", "x", "--time", "3x", "--", "true")
    assert result.code == 2
    assert "not a duration" in result.err
    assert "Traceback" not in result.err


def test_array_ranges_parse_and_bad_ones_say_how_to_write_them() -> None:
    from labctl.parsing import parse_array

    assert parse_array("0-3") == [0, 1, 2, 3]
    assert parse_array("1,4,7") == [1, 4, 7]
    assert parse_array("0-2,2,10") == [0, 1, 2, 10]
    for bad, hint in (("a-b", "use 0-9"), ("5-1", "write it as 1-5"), ("0-1000", "at most 1000")):
        with pytest.raises(ValueError, match=hint):
            parse_array(bad)


def test_labctl_holds_the_portals_array_limit_and_sends_indices_as_ranges() -> None:
    from jobqueue.arrays import MAX_ARRAY as PORTAL_MAX
    from labctl.parsing import MAX_ARRAY, array_text, parse_array

    assert MAX_ARRAY == PORTAL_MAX
    assert array_text([0, 1, 2, 7, 9, 10]) == "0-2,7,9-10"
    assert array_text([5]) == "5"
    assert parse_array(array_text(list(range(MAX_ARRAY)))) == list(range(MAX_ARRAY))


def test_a_shell_line_shows_as_typed_and_an_argument_list_shell_quoted() -> None:
    from labctl.cli import _command_line

    assert _command_line(["/bin/sh", "-c", "sleep 20; echo done"]) == "sleep 20; echo done"
    assert _command_line(["python", "a b.py"]) == "python 'a b.py'"


def test_a_count_is_a_whole_number_of_one_or_more() -> None:
    assert parse_count("50") == 50
    for text in ("0", "-3", "2.5", "ten", ""):
        with pytest.raises(ValueError, match="whole number of 1 or more"):
            parse_count(text)

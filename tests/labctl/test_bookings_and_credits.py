"""Booking GPUs and reading credits with labctl against a live portal."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from labctl.cli import new_output
from tests.labctl.conftest import Run

pytestmark = pytest.mark.django_db(transaction=True)


def tomorrow_at(hour: int) -> str:
    day = datetime.now().astimezone() + timedelta(days=1)
    return day.replace(hour=hour, minute=0, second=0, microsecond=0).strftime("%Y-%m-%d %H:%M")


def test_alice_books_lists_and_cancels_gpus_on_a_node(labctl: Run, as_alice: str) -> None:
    booked = labctl(
        "book",
        "--gpus",
        "2",
        "--node",
        "gpu02",
        "--start",
        tomorrow_at(10),
        "--hours",
        "2",
        "--note",
        "ablation",
    )
    assert booked.code == 0, booked.err
    assert "Booked booking" in booked.out and "gpu02" in booked.out

    listing = labctl("--json", "bookings").json()
    assert (
        len(listing) == 1 and listing[0]["note"] == "ablation" and listing[0]["state"] == "booked"
    )
    assert "ablation" in labctl("bookings").out

    cancelled = labctl("book", "cancel", str(listing[0]["id"]))
    assert cancelled.code == 0, cancelled.err
    assert "cancelled" in cancelled.out
    assert labctl("--json", "bookings").json() == []
    assert labctl("--json", "bookings", "--all").json()[0]["state"] == "cancelled"


def test_without_a_node_labctl_books_the_first_node_free_then(labctl: Run, as_alice: str) -> None:
    booking = labctl(
        "--json", "book", "--gpus", "1", "--start", tomorrow_at(12), "--hours", "1"
    ).json()
    assert len(booking["gpus"]) == 1
    extended = labctl("--json", "book", "extend", str(booking["id"]), "--hours", "1").json()
    ends = [datetime.fromisoformat(b["end"].replace("Z", "+00:00")) for b in (booking, extended)]
    assert ends[1] - ends[0] == timedelta(hours=1)


def test_a_booking_off_the_grid_is_refused_with_the_portals_rule(
    labctl: Run, as_alice: str
) -> None:
    result = labctl(
        "book",
        "--gpus",
        "1",
        "--node",
        "gpu01",
        "--start",
        tomorrow_at(10)[:-2] + "10",
        "--hours",
        "1",
    )
    assert result.code == 1
    assert "grid" in result.err


def test_book_without_its_options_is_a_usage_error(labctl: Run, as_alice: str) -> None:
    result = labctl("book", "--gpus", "1")
    assert result.code == 2
    assert "--start" in result.err and "--hours" in result.err


def test_suggest_prints_a_slot_and_the_command_that_books_it(labctl: Run, as_alice: str) -> None:
    result = labctl("suggest", "--gpus", "2", "--hours", "3")
    assert result.code == 0, result.err
    assert "Earliest free slot" in result.out and "labctl book --gpus 2 --node gpu0" in result.out
    assert (
        labctl("--json", "suggest", "--gpus", "2", "--hours", "3").json()["node"].startswith("gpu0")
    )


def test_credits_prints_the_balance_and_the_ledger(labctl: Run, as_alice: str) -> None:
    labctl("book", "--gpus", "1", "--node", "gpu01", "--start", tomorrow_at(14), "--hours", "1")
    result = labctl("credits")
    assert result.code == 0, result.err
    assert "balance:" in result.out and "burn rate:" in result.out
    data = labctl("--json", "credits").json()
    assert data["credits"]["username"] == "alice"
    assert "balance" in data["credits"] and isinstance(data["ledger"], list)


def test_new_log_output_is_found_in_a_sliding_tail() -> None:
    assert new_output("", "a\n") == "a\n"
    assert new_output("a\nb\n", "a\nb\nc\n") == "c\n"
    assert new_output("a\nb\nc\n", "b\nc\nd\ne\n") == "d\ne\n"
    assert new_output("a\n", "a\n") == ""
    assert new_output("x\n", "y\n") == "y\n"

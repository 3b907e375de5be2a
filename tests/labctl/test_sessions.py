"""labctl session start / list / open / stop against a live portal."""

from __future__ import annotations

import pytest

from tests.labctl.conftest import Run

pytestmark = pytest.mark.django_db(transaction=True)


def test_alice_starts_lists_opens_and_stops_a_session(labctl: Run, as_alice: str) -> None:
    result = labctl(
        "--json",
        "session",
        "start",
        "--kind",
        "jupyter",
        "--image",
        "labportal/busybox:test",
        "--queue",
        "normal",
    )
    assert result.code == 0, result.err
    job = result.json()["job"]
    assert job["kind"] == "jupyter"
    listed = labctl("session", "list")
    assert listed.code == 0 and str(job["id"]) in listed.out and "jupyter" in listed.out
    opened = labctl("session", "open", str(job["id"]))
    # Not running yet: it says so, with where it will open, and exits non-zero.
    assert opened.code != 0 and f"/sessions/{job['id']}/lab" in opened.out
    stopped = labctl("session", "stop", str(job["id"]))
    assert stopped.code == 0 and "stop requested (cancelled)" in stopped.out


def test_start_without_an_image_says_what_is_missing(labctl: Run, as_alice: str) -> None:
    result = labctl("session", "start")
    assert result.code != 0 and "--image" in result.err

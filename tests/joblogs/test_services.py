"""Storing a job's output by offset: copies, overlaps, gaps, the cap and its rotation."""

from __future__ import annotations

from typing import Any

import pytest

from joblogs.models import JobLog
from joblogs.selectors import gap_marker, latest_log, log_bytes, log_read, tail_offset
from joblogs.services import job_log_append

pytestmark = pytest.mark.django_db


def whole(log: JobLog) -> bytes:
    return b"".join(log_bytes(log))


def append(job: Any, offset: int, data: bytes, **kw: Any) -> Any:
    return job_log_append(job_id=job.pk, stream="c1", offset=offset, data=data, **kw)


def test_chunks_in_order_make_the_whole_output(running_job: Any) -> None:
    append(running_job, 0, b"hello ")
    append(running_job, 6, b"world\n", final=True)
    log = latest_log(running_job)
    assert log is not None and log.complete
    assert whole(log) == b"hello world\n"
    assert log.received_end == 12 and log.stored_bytes == 12


def test_a_resent_or_overlapping_chunk_never_duplicates_a_byte(running_job: Any) -> None:
    append(running_job, 0, b"abcdef")
    again = append(running_job, 0, b"abcdef")
    assert again.stored == 0
    overlap = append(running_job, 3, b"defghi")
    assert overlap.stored == 3
    log = latest_log(running_job)
    assert log is not None
    assert whole(log) == b"abcdefghi"
    assert log.stored_bytes == 9


def test_chunks_out_of_order_are_stored_once_each_and_read_in_order(running_job: Any) -> None:
    append(running_job, 4, b"5678")
    log = latest_log(running_job)
    assert log is not None
    # A follower waits at the hole: the chunk before it is on its way.
    assert log_read(log, 0).data == b"" and log_read(log, 0).next_offset == 0
    append(running_job, 0, b"1234")
    log.refresh_from_db()
    read = log_read(log, 0)
    assert read.data == b"12345678" and read.next_offset == 8


def test_bytes_that_never_arrive_show_as_a_gap_once_the_output_ended(running_job: Any) -> None:
    append(running_job, 0, b"start\n")
    append(running_job, 106, b"end\n", final=True)
    log = latest_log(running_job)
    assert log is not None
    assert whole(log) == b"start\n" + gap_marker(100) + b"end\n"
    assert log_read(log, 0).data == b"start\n" + gap_marker(100) + b"end\n"


def test_past_the_cap_the_head_and_the_newest_output_are_kept_and_the_gap_marked(
    running_job: Any,
) -> None:
    cap = 1000
    output = b"".join(f"{i:05d}\n".encode() for i in range(1000))
    for offset in range(0, len(output), 100):
        append(running_job, offset, output[offset : offset + 100], cap_bytes=cap)
    log = latest_log(running_job)
    assert log is not None
    assert log.stored_bytes == cap
    assert log.head_bytes == 250
    dropped = len(output) - cap
    assert log.dropped_bytes == dropped
    assert whole(log) == output[:250] + gap_marker(dropped) + output[250 + dropped :]
    # A late copy of a dropped chunk is not stored again.
    assert append(running_job, 1000, output[1000:1100], cap_bytes=cap).stored == 0


def test_a_follower_in_the_dropped_middle_jumps_to_the_kept_output(running_job: Any) -> None:
    # Head: bytes 0-249; the cap drops 200 bytes after it, so 450-1199 are kept.
    append(running_job, 0, b"x" * 300 + b"y" * 900, cap_bytes=1000)
    log = latest_log(running_job)
    assert log is not None
    read = log_read(log, 260)
    assert read.data == gap_marker(190) + b"y" * 750
    assert read.next_offset == 1200
    assert log_read(log, 0).data == b"x" * 250 + gap_marker(200) + b"y" * 750


def test_a_new_attempt_gets_a_log_of_its_own_and_the_page_shows_the_newest(
    running_job: Any,
) -> None:
    append(running_job, 0, b"first attempt\n")
    job_log_append(job_id=running_job.pk, stream="c2", offset=0, data=b"second\n")
    log = latest_log(running_job)
    assert log is not None and log.stream == "c2"
    assert whole(log) == b"second\n"


def test_tail_finds_the_start_of_the_last_lines(running_job: Any) -> None:
    append(running_job, 0, b"one\ntwo\n")
    append(running_job, 8, b"three\nfour\n")
    log = latest_log(running_job)
    assert log is not None
    assert log_read(log, tail_offset(log, 2)).data == b"three\nfour\n"
    assert log_read(log, tail_offset(log, 3)).data == b"two\nthree\nfour\n"
    assert log_read(log, tail_offset(log, 99)).data == b"one\ntwo\nthree\nfour\n"


def test_a_read_stops_before_a_character_cut_in_half(running_job: Any) -> None:
    snowman = "☃".encode()
    append(running_job, 0, b"a" + snowman[:2])
    log = latest_log(running_job)
    assert log is not None
    assert log_read(log, 0).data == b"a" and log_read(log, 0).next_offset == 1
    append(running_job, 3, snowman[2:] + b"\n")
    log.refresh_from_db()
    assert log_read(log, 1).data.decode() == "☃\n"


def test_small_contiguous_chunks_are_merged_into_few_rows(running_job: Any) -> None:
    for i in range(50):
        append(running_job, i * 10, b"0123456789")
    log = latest_log(running_job)
    assert log is not None
    assert log.chunks.count() == 1
    assert whole(log) == b"0123456789" * 50

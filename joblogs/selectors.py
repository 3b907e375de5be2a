"""Reading a job's output: from an offset (the page's and labctl's follow), its last lines,
and the whole of it as a stream of bytes (the download), gaps marked."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.utils.translation import gettext as _

from joblogs.models import JobLog, JobLogChunk
from jobqueue.models import Job

READ_LIMIT_BYTES = 1024 * 1024
MAX_READ_LIMIT_BYTES = 4 * 1024 * 1024
# How far back `tail` looks for the start of the last lines.
TAIL_SCAN_BYTES = 8 * 1024 * 1024


def latest_log(job: Job | int) -> JobLog | None:
    """The log of the job's newest attempt, or None (not started, or an agent that sends none)."""
    job_id = job if isinstance(job, int) else job.pk
    return JobLog.objects.filter(job_id=job_id).order_by("-pk").first()


def gap_marker(count: int) -> bytes:
    """What stands in the output for ``count`` bytes that are not kept."""
    text = _("… %(count)s bytes dropped …") % {"count": f"{count:,}"}
    return f"\n{text}\n".encode()


@dataclass(frozen=True)
class LogRead:
    offset: int
    next_offset: int
    data: bytes  # the bytes from offset, a marker standing for each gap
    size: int  # the output's size so far
    complete: bool
    dropped_bytes: int


def _gap_settled(log: JobLog, gap_end: int) -> bool:
    """A gap to mark now: dropped for the cap, or the output ended without those bytes.

    Any other gap is a chunk on its way (two arrive out of order): the reader waits.
    """
    return log.complete or gap_end <= log.rotated_until


def log_read(log: JobLog, offset: int, limit: int = READ_LIMIT_BYTES) -> LogRead:
    """Up to ``limit`` bytes of the output from ``offset``; ``next_offset`` is where to go on."""
    out = bytearray()
    pos = offset
    chunks = log.chunks.filter(end__gt=offset).order_by("offset").only("offset", "end", "data")
    for chunk in chunks.iterator(chunk_size=4):
        if chunk.offset > pos:
            if not _gap_settled(log, chunk.offset):
                break
            out += gap_marker(chunk.offset - pos)
            pos = chunk.offset
        piece = bytes(chunk.data)[pos - chunk.offset :][: max(0, limit - len(out))]
        out += piece
        pos += len(piece)
        if len(out) >= limit:
            break
    if pos < log.received_end and log.complete and pos >= _last_end(log):
        out += gap_marker(log.received_end - pos)  # the end never arrived (or was dropped)
        pos = log.received_end
    cut = _incomplete_utf8_suffix(out) if pos < log.received_end or not log.complete else 0
    if cut:
        del out[-cut:]
        pos -= cut
    return LogRead(
        offset=offset,
        next_offset=pos,
        data=bytes(out),
        size=log.received_end,
        complete=log.complete,
        dropped_bytes=log.dropped_bytes,
    )


def _last_end(log: JobLog) -> int:
    last = log.chunks.order_by("-offset").values_list("end", flat=True).first()
    return last or 0


def _incomplete_utf8_suffix(data: bytearray) -> int:
    """How many bytes at the end start a UTF-8 character that is not complete yet (0–3)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte (or ASCII)
            need = (
                2
                if byte >> 5 == 0b110
                else 3
                if byte >> 4 == 0b1110
                else 4
                if byte >> 3 == 0b11110
                else 1
            )
            return back if need > back else 0
    return 0


def tail_offset(log: JobLog, lines: int) -> int:
    """The offset where the output's last ``lines`` lines begin (looking back a few MiB at most)."""
    if lines <= 0:
        return log.received_end
    seen = 0
    newlines = 0
    start = log.received_end
    chunks = log.chunks.order_by("-offset").only("offset", "end", "data")
    for chunk in chunks.iterator(chunk_size=4):
        data = bytes(chunk.data)
        # A final newline ends the last line; it does not start one more.
        end = len(data) - 1 if chunk.end == log.received_end and data.endswith(b"\n") else len(data)
        index = end
        while True:
            index = data.rfind(b"\n", 0, index)
            if index < 0:
                break
            newlines += 1
            if newlines >= lines:
                return chunk.offset + index + 1
        start = chunk.offset
        seen += len(data)
        if seen >= TAIL_SCAN_BYTES:
            break
    return start


def log_bytes(log: JobLog) -> Iterator[bytes]:
    """The whole log, chunk by chunk, gaps marked; holds one chunk in memory at a time."""
    spans = list(log.chunks.order_by("offset").values_list("pk", "offset", "end"))
    pos = 0
    for pk, offset, end in spans:
        if offset > pos:
            yield gap_marker(offset - pos)
        data = JobLogChunk.objects.values_list("data", flat=True).get(pk=pk)
        yield bytes(data)[max(0, pos - offset) :]
        pos = max(pos, end)
    if log.complete and pos < log.received_end:
        yield gap_marker(log.received_end - pos)


def job_page_log(job: Job) -> dict[str, Any]:
    """The job page's full-log panel (see ``jobqueue.extensions``); an ended job with no log
    (from an agent of an earlier release) keeps the tail of its end event instead."""
    log = latest_log(job)
    if log is None and job.is_final:
        return {}
    return {"job_log_panel": True, "job_log": log}

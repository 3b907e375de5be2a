"""Writing a job's output: chunks stored once by offset, and the size cap with its rotation.

The writer runs in the control worker (``joblogs.tasks``, for the agents' chunks) and
in Slurm's sync (``slurm.services``, which reads the job's output file). Both call
``job_log_append`` with the chunk's offset in the job's output, so whatever arrives
twice, late or out of order is stored once, and bytes that never arrive show as a gap.

The cap (``LABPORTAL_JOB_LOG_MAX_BYTES``): the first quarter of it is the log's head,
always kept; past the cap, the oldest output after the head is dropped, so the log
keeps how the job began and its newest output. A full log never fails a job.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.db.models import F

from joblogs.models import JobLog, JobLogChunk

# Contiguous output is merged into chunks of up to this size, so that a job that prints
# a line a second does not make a row a second.
CHUNK_TARGET_BYTES = 256 * 1024


@dataclass(frozen=True)
class AppendResult:
    log: JobLog
    stored: int  # new bytes stored (0 for a chunk that was all a copy)
    dropped: int  # bytes dropped by the rotation this time


def log_cap_bytes() -> int:
    return int(settings.LABPORTAL_JOB_LOG_MAX_BYTES)


@transaction.atomic
def job_log_append(
    *,
    job_id: int,
    stream: str,
    offset: int,
    data: bytes,
    final: bool = False,
    cap_bytes: int | None = None,
) -> AppendResult:
    """Store bytes ``[offset, offset + len(data))`` of the job's ``stream``; idempotent.

    Only the bytes not stored yet (nor dropped by the rotation) are added; ``final``
    marks the output complete. Then the log is brought back under its cap.
    """
    cap = cap_bytes if cap_bytes is not None else log_cap_bytes()
    log, _created = JobLog.objects.get_or_create(
        job_id=job_id, stream=stream, defaults={"head_bytes": cap // 4}
    )
    # One writer at a time per log (a no-op on SQLite, which writes one at a time anyway).
    log = JobLog.objects.select_for_update().get(pk=log.pk)
    end = offset + len(data)
    stored = 0
    for start, stop in _missing_ranges(log, offset, end):
        stored += _store(log, start, data[start - offset : stop - offset])
    log.stored_bytes += stored
    log.received_end = max(log.received_end, end)
    if final:
        log.complete = True
    dropped = _rotate(log, cap)
    log.save()
    return AppendResult(log=log, stored=stored, dropped=dropped)


def _missing_ranges(log: JobLog, start: int, end: int) -> list[tuple[int, int]]:
    """The parts of ``[start, end)`` not stored yet, split at the head's end."""
    if start >= end:
        return []
    covered = list(
        log.chunks.filter(offset__lt=end, end__gt=start)
        .order_by("offset")
        .values_list("offset", "end")
    )
    if log.rotated_until > log.head_bytes:
        covered.append((log.head_bytes, log.rotated_until))  # dropped: never stored again
        covered.sort()
    missing = []
    cursor = start
    for c_start, c_end in covered:
        if c_start > cursor:
            missing.append((cursor, min(c_start, end)))
        cursor = max(cursor, c_end)
        if cursor >= end:
            break
    if cursor < end:
        missing.append((cursor, end))
    head = log.head_bytes
    split: list[tuple[int, int]] = []
    for a, b in missing:
        if a < head < b:
            split += [(a, head), (head, b)]
        else:
            split.append((a, b))
    return split


def _store(log: JobLog, start: int, piece: bytes) -> int:
    """Store one missing piece, appended to the chunk it continues where that chunk is small."""
    previous = (
        log.chunks.filter(end=start).only("pk", "offset", "end").first()
        if start != log.head_bytes
        else None
    )
    if previous is not None and previous.end - previous.offset + len(piece) <= CHUNK_TARGET_BYTES:
        current = bytes(JobLogChunk.objects.values_list("data", flat=True).get(pk=previous.pk))
        JobLogChunk.objects.filter(pk=previous.pk).update(
            data=current + piece, end=F("end") + len(piece)
        )
    else:
        JobLogChunk.objects.create(log=log, offset=start, end=start + len(piece), data=piece)
    return len(piece)


def _rotate(log: JobLog, cap: int) -> int:
    """Drop the oldest output after the head until the log holds at most ``cap`` bytes."""
    excess = log.stored_bytes - cap
    if excess <= 0:
        return 0
    dropped = 0
    tail = log.chunks.filter(offset__gte=log.head_bytes).order_by("offset")
    for chunk in tail.only("pk", "offset", "end").iterator(chunk_size=64):
        if excess <= 0:
            break
        size = chunk.end - chunk.offset
        if size <= excess:
            JobLogChunk.objects.filter(pk=chunk.pk).delete()
            cut = size
            log.rotated_until = max(log.rotated_until, chunk.end)
        else:
            cut = excess
            data = bytes(JobLogChunk.objects.values_list("data", flat=True).get(pk=chunk.pk))
            JobLogChunk.objects.filter(pk=chunk.pk).update(
                offset=chunk.offset + cut, data=data[cut:]
            )
            log.rotated_until = max(log.rotated_until, chunk.offset + cut)
        excess -= cut
        dropped += cut
    log.stored_bytes -= dropped
    log.dropped_bytes += dropped
    return dropped

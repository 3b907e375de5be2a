"""Rollups and retention: raw samples into per-GPU minutes, minutes into hours, old rows pruned.

Each level keeps a cursor (`RollupCursor.done_until`). A run recomputes every bucket
from a little before its cursor (`LATE_WINDOW`, for batches that arrive a few seconds
or minutes late) up to the newest complete data, in bounded chunks, each chunk and
its cursor move in one transaction. Buckets are recomputed from their source rows
and upserted, so running twice changes nothing, and a beat that was down catches up
from its cursor. A batch that arrives later than `LATE_WINDOW` moves the cursors back
(`rollups_rewind`), so its buckets are recomputed too.

PostgreSQL aggregates in SQL (`date_trunc` with `INSERT … ON CONFLICT`); SQLite, for
the demo, aggregates the same way in Python and upserts through the ORM.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, models, transaction
from django.db.models import Min, Q
from django.utils import timezone

from jobqueue.models import Allocation, Job
from telemetry.models import (
    GpuHourRollup,
    GpuMinuteRollup,
    GpuSample,
    RetentionPolicy,
    RollupCursor,
)

log = logging.getLogger(__name__)

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
# Agents send a batch every ~30 s; every run recomputes this much before its cursor.
LATE_WINDOW = timedelta(minutes=5)
# One statement aggregates at most this much source time (bounded memory and locks).
MINUTE_CHUNK = timedelta(hours=1)
HOUR_CHUNK = timedelta(days=1)
PRUNE_BATCH = 10_000

_MINUTE_FIELDS = [
    "samples",
    "util_mean",
    "util_max",
    "mem_used_max_mb",
    "temp_max_c",
    "power_mean_w",
    "job",
    "user",
]
_HOUR_FIELDS = [*_MINUTE_FIELDS, "minutes", "busy_minutes", "held_minutes"]
# pg_try_advisory_xact_lock keys: one rollup run per level at a time.
_LOCK_KEYS: dict[str, int] = {
    RollupCursor.Level.MINUTE: 0x4C50_0001,
    RollupCursor.Level.HOUR: 0x4C50_0002,
}


def floor_to(moment: datetime, step: timedelta) -> datetime:
    """The start of the UTC bucket of length `step` (a minute or an hour) holding `moment`."""
    epoch = datetime(2000, 1, 1, tzinfo=UTC)
    return epoch + ((moment - epoch) // step) * step


@dataclass(frozen=True)
class RollupResult:
    minute_buckets: int
    hour_buckets: int
    caught_up: bool


def rollups_run(*, now: datetime | None = None, budget_s: float = 50.0) -> RollupResult:
    """Roll raw samples up into minutes, then minutes into hours, until caught up or out of time.

    Safe to run twice or concurrently: a second concurrent run on PostgreSQL stops at
    once, and recomputing a bucket writes the same values.
    """
    now = now or timezone.now()
    deadline = time.monotonic() + budget_s
    minutes, minutes_done = _level_run(
        level=RollupCursor.Level.MINUTE,
        source_end=floor_to(now, MINUTE),
        deadline=deadline,
    )
    minute_cursor = RollupCursor.objects.filter(level=RollupCursor.Level.MINUTE).first()
    hours, hours_done = 0, True
    if minute_cursor is not None and minute_cursor.done_until is not None:
        hours, hours_done = _level_run(
            level=RollupCursor.Level.HOUR,
            source_end=minute_cursor.done_until,
            deadline=deadline,
        )
    return RollupResult(
        minute_buckets=minutes, hour_buckets=hours, caught_up=minutes_done and hours_done
    )


def rollups_rewind(*, to: datetime, now: datetime | None = None) -> int:
    """Move the cursors back to `to`, so the next run recomputes the buckets a late batch touched.

    Never before the raw retention: older raw samples may be pruned already, and
    recomputing their minutes from what is left would lose data.
    """
    now = now or timezone.now()
    floor = floor_to(now - timedelta(days=RetentionPolicy.current().raw_days), MINUTE) + HOUR
    target = floor_to(max(to, floor), MINUTE)
    return RollupCursor.objects.filter(done_until__gt=target).update(done_until=target)


def _level_run(*, level: str, source_end: datetime, deadline: float) -> tuple[int, bool]:
    step = MINUTE if level == RollupCursor.Level.MINUTE else HOUR
    chunk = MINUTE_CHUNK if level == RollupCursor.Level.MINUTE else HOUR_CHUNK
    cursor, _created = RollupCursor.objects.get_or_create(level=level)
    if cursor.done_until is None:
        first = _first_source_time(level)
        if first is None:
            return 0, True
        start = floor_to(first, step)
    else:
        start = floor_to(cursor.done_until - LATE_WINDOW, step)
    seen_cursor = cursor.done_until
    written = 0
    while start < source_end:
        if time.monotonic() > deadline:
            return written, False
        chunk_end = min(start + chunk, source_end)
        with transaction.atomic():
            if not _try_lock(level):
                log.info("another %s rollup is running; this one stops", level)
                return written, False
            # Claim the range: if ingest moved the cursor back meanwhile, stop and let the
            # next run start from there.
            moved = RollupCursor.objects.filter(level=level, done_until=seen_cursor).update(
                done_until=chunk_end, last_run_at=timezone.now()
            )
            if not moved:
                return written, False
            if level == RollupCursor.Level.MINUTE:
                rows = _minutes_compute(start, chunk_end)
            else:
                rows = _hours_compute(start, chunk_end)
        written += rows
        seen_cursor = chunk_end
        start = chunk_end
        if not rows:  # a gap with no readings (the lab was off): skip to the next data
            following = _next_source_time(level, chunk_end)
            start = source_end if following is None else max(start, floor_to(following, step))
    return written, True


def _first_source_time(level: str) -> datetime | None:
    return _next_source_time(level, None)


def _next_source_time(level: str, after: datetime | None) -> datetime | None:
    """The earliest source row at or after `after` (or at all)."""
    if level == RollupCursor.Level.MINUTE:
        samples = GpuSample.objects.all()
        if after is not None:
            samples = samples.filter(ts__gte=after)
        first: datetime | None = samples.aggregate(first=Min("ts"))["first"]
        return first
    minutes = GpuMinuteRollup.objects.all()
    if after is not None:
        minutes = minutes.filter(bucket__gte=after)
    first = minutes.aggregate(first=Min("bucket"))["first"]
    return first


def _try_lock(level: str) -> bool:
    if connection.vendor != "postgresql":
        return True  # SQLite writes one transaction at a time (transaction_mode IMMEDIATE)
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_xact_lock(%s)", [_LOCK_KEYS[level]])
        return bool(cur.fetchone()[0])


# --- Minutes ----------------------------------------------------------------


def _minutes_compute(start: datetime, end: datetime) -> int:
    """Recompute the minute rows of [start, end) from the raw samples; return rows written."""
    if connection.vendor == "postgresql":
        return _minutes_sql(start, end)
    return _minutes_python(start, end)


_MINUTES_SQL = """
WITH s AS (
    SELECT gpu_id, date_trunc('minute', ts AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS bucket,
           util_pct, mem_used_mb, temp_c, power_w, job_id
    FROM {sample} WHERE ts >= %(start)s AND ts < %(end)s
),
agg AS (
    SELECT gpu_id, bucket, count(*) AS samples,
           avg(util_pct) AS util_mean, max(util_pct) AS util_max,
           max(mem_used_mb) AS mem_used_max_mb, max(temp_c) AS temp_max_c,
           avg(power_w) AS power_mean_w
    FROM s GROUP BY gpu_id, bucket
),
seen AS (
    SELECT DISTINCT ON (gpu_id, bucket) gpu_id, bucket, job_id
    FROM (SELECT gpu_id, bucket, job_id, count(*) AS n FROM s
          WHERE job_id IS NOT NULL GROUP BY gpu_id, bucket, job_id) per_job
    ORDER BY gpu_id, bucket, n DESC, job_id
),
held AS (
    SELECT DISTINCT ON (agg.gpu_id, agg.bucket) agg.gpu_id, agg.bucket, a.job_id
    FROM agg JOIN {allocation} a ON a.gpu_id = agg.gpu_id
        AND a.allocated_at < agg.bucket + interval '1 minute'
        AND (a.released_at IS NULL OR a.released_at > agg.bucket)
    WHERE a.allocated_at < %(end)s AND (a.released_at IS NULL OR a.released_at > %(start)s)
    ORDER BY agg.gpu_id, agg.bucket, a.allocated_at DESC, a.job_id DESC
)
INSERT INTO {minute} (gpu_id, bucket, samples, util_mean, util_max, mem_used_max_mb,
                      temp_max_c, power_mean_w, job_id, user_id)
SELECT agg.gpu_id, agg.bucket, agg.samples, agg.util_mean, agg.util_max, agg.mem_used_max_mb,
       agg.temp_max_c, agg.power_mean_w, j.id, j.owner_id
FROM agg
LEFT JOIN seen ON seen.gpu_id = agg.gpu_id AND seen.bucket = agg.bucket
LEFT JOIN held ON held.gpu_id = agg.gpu_id AND held.bucket = agg.bucket
LEFT JOIN {job} j ON j.id = coalesce(seen.job_id, held.job_id)
ON CONFLICT (gpu_id, bucket) DO UPDATE SET
    samples = EXCLUDED.samples, util_mean = EXCLUDED.util_mean, util_max = EXCLUDED.util_max,
    mem_used_max_mb = EXCLUDED.mem_used_max_mb, temp_max_c = EXCLUDED.temp_max_c,
    power_mean_w = EXCLUDED.power_mean_w, job_id = EXCLUDED.job_id, user_id = EXCLUDED.user_id
"""


def _minutes_sql(start: datetime, end: datetime) -> int:
    sql = _MINUTES_SQL.format(
        sample=GpuSample._meta.db_table,
        allocation=Allocation._meta.db_table,
        minute=GpuMinuteRollup._meta.db_table,
        job=Job._meta.db_table,
    )
    with connection.cursor() as cur:
        cur.execute(sql, {"start": start, "end": end})
        return int(cur.rowcount)


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _max(values: Iterable[Any]) -> Any:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _top_job(counts: Counter[int]) -> int | None:
    """The most frequent job; on a tie the lowest id (as the SQL path orders)."""
    if not counts:
        return None
    return min(counts, key=lambda job_id: (-counts[job_id], job_id))


def _minutes_python(start: datetime, end: datetime) -> int:
    buckets: dict[tuple[int, datetime], list[Any]] = defaultdict(list)
    for sample in GpuSample.objects.filter(ts__gte=start, ts__lt=end).values_list(
        "gpu_id", "ts", "util_pct", "mem_used_mb", "temp_c", "power_w", "job_id", named=True
    ):
        buckets[(sample.gpu_id, floor_to(sample.ts, MINUTE))].append(sample)
    allocations = list(
        Allocation.objects.filter(allocated_at__lt=end)
        .filter(Q(released_at__isnull=True) | Q(released_at__gt=start))
        .values_list("gpu_id", "job_id", "allocated_at", "released_at")
    )

    def held_by(gpu_id: int, bucket: datetime) -> int | None:
        overlapping = [
            (allocated_at, job_id)
            for a_gpu, job_id, allocated_at, released_at in allocations
            if a_gpu == gpu_id
            and allocated_at < bucket + MINUTE
            and (released_at is None or released_at > bucket)
        ]
        return max(overlapping)[1] if overlapping else None

    chosen: dict[tuple[int, datetime], int | None] = {}
    for key, rows in buckets.items():
        seen = _top_job(Counter(r.job_id for r in rows if r.job_id is not None))
        chosen[key] = seen if seen is not None else held_by(*key)
    owners = dict(
        Job.objects.filter(pk__in={j for j in chosen.values() if j is not None}).values_list(
            "pk", "owner_id"
        )
    )
    objects = []
    for (gpu_id, bucket), rows in buckets.items():
        job_id = chosen[(gpu_id, bucket)]
        objects.append(
            GpuMinuteRollup(
                gpu_id=gpu_id,
                bucket=bucket,
                samples=len(rows),
                util_mean=_mean(r.util_pct for r in rows),
                util_max=_max(r.util_pct for r in rows),
                mem_used_max_mb=_max(r.mem_used_mb for r in rows),
                temp_max_c=_max(r.temp_c for r in rows),
                power_mean_w=_mean(r.power_w for r in rows),
                job_id=job_id if job_id in owners else None,
                user_id=owners.get(job_id) if job_id is not None else None,
            )
        )
    _upsert(GpuMinuteRollup, objects, _MINUTE_FIELDS)
    return len(objects)


# --- Hours ------------------------------------------------------------------


def _hours_compute(start: datetime, end: datetime) -> int:
    """Recompute the hour rows holding minutes [start, end) from those minutes."""
    if connection.vendor == "postgresql":
        return _hours_sql(start, end)
    return _hours_python(start, end)


_HOURS_SQL = """
WITH m AS (
    SELECT *, date_trunc('hour', bucket AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS hour
    FROM {minute} WHERE bucket >= %(start)s AND bucket < %(end)s
),
agg AS (
    SELECT gpu_id, hour AS bucket, sum(samples) AS samples,
           sum(util_mean * samples)
               / nullif(sum(samples) FILTER (WHERE util_mean IS NOT NULL), 0) AS util_mean,
           max(util_max) AS util_max, max(mem_used_max_mb) AS mem_used_max_mb,
           max(temp_max_c) AS temp_max_c,
           sum(power_mean_w * samples)
               / nullif(sum(samples) FILTER (WHERE power_mean_w IS NOT NULL), 0) AS power_mean_w,
           count(*) AS minutes, count(job_id) AS busy_minutes
    FROM m GROUP BY gpu_id, hour
),
top AS (
    SELECT DISTINCT ON (gpu_id, hour) gpu_id, hour AS bucket, job_id, user_id, n
    FROM (SELECT gpu_id, hour, job_id, user_id, count(*) AS n FROM m
          WHERE job_id IS NOT NULL GROUP BY gpu_id, hour, job_id, user_id) per_job
    ORDER BY gpu_id, hour, n DESC, job_id
)
INSERT INTO {hour} (gpu_id, bucket, samples, util_mean, util_max, mem_used_max_mb, temp_max_c,
                    power_mean_w, job_id, user_id, minutes, busy_minutes, held_minutes)
SELECT agg.gpu_id, agg.bucket, agg.samples, agg.util_mean, agg.util_max, agg.mem_used_max_mb,
       agg.temp_max_c, agg.power_mean_w, top.job_id, top.user_id, agg.minutes,
       agg.busy_minutes, coalesce(top.n, 0)
FROM agg LEFT JOIN top ON top.gpu_id = agg.gpu_id AND top.bucket = agg.bucket
ON CONFLICT (gpu_id, bucket) DO UPDATE SET
    samples = EXCLUDED.samples, util_mean = EXCLUDED.util_mean, util_max = EXCLUDED.util_max,
    mem_used_max_mb = EXCLUDED.mem_used_max_mb, temp_max_c = EXCLUDED.temp_max_c,
    power_mean_w = EXCLUDED.power_mean_w, job_id = EXCLUDED.job_id, user_id = EXCLUDED.user_id,
    minutes = EXCLUDED.minutes, busy_minutes = EXCLUDED.busy_minutes,
    held_minutes = EXCLUDED.held_minutes
"""


def _hours_sql(start: datetime, end: datetime) -> int:
    # Whole hours: the first hour's earlier minutes count too.
    sql = _HOURS_SQL.format(
        minute=GpuMinuteRollup._meta.db_table, hour=GpuHourRollup._meta.db_table
    )
    with connection.cursor() as cur:
        cur.execute(sql, {"start": floor_to(start, HOUR), "end": end})
        return int(cur.rowcount)


def _weighted_mean(pairs: Iterable[tuple[float | None, int]]) -> float | None:
    present = [(v, w) for v, w in pairs if v is not None]
    weight = sum(w for _v, w in present)
    return sum(v * w for v, w in present) / weight if weight else None


def _hours_python(start: datetime, end: datetime) -> int:
    hours: dict[tuple[int, datetime], list[GpuMinuteRollup]] = defaultdict(list)
    for minute in GpuMinuteRollup.objects.filter(bucket__gte=floor_to(start, HOUR), bucket__lt=end):
        hours[(minute.gpu_id, floor_to(minute.bucket, HOUR))].append(minute)
    objects = []
    for (gpu_id, bucket), minutes in hours.items():
        held = Counter(m.job_id for m in minutes if m.job_id is not None)
        job_id = _top_job(held)
        objects.append(
            GpuHourRollup(
                gpu_id=gpu_id,
                bucket=bucket,
                samples=sum(m.samples for m in minutes),
                util_mean=_weighted_mean((m.util_mean, m.samples) for m in minutes),
                util_max=_max(m.util_max for m in minutes),
                mem_used_max_mb=_max(m.mem_used_max_mb for m in minutes),
                temp_max_c=_max(m.temp_max_c for m in minutes),
                power_mean_w=_weighted_mean((m.power_mean_w, m.samples) for m in minutes),
                job_id=job_id,
                user_id=next((m.user_id for m in minutes if m.job_id == job_id), None)
                if job_id is not None
                else None,
                minutes=len(minutes),
                busy_minutes=sum(1 for m in minutes if m.job_id is not None),
                held_minutes=held[job_id] if job_id is not None else 0,
            )
        )
    _upsert(GpuHourRollup, objects, _HOUR_FIELDS)
    return len(objects)


def _upsert(model: type[models.Model], objects: list[Any], fields: list[str]) -> None:
    model._default_manager.bulk_create(
        objects,
        update_conflicts=True,
        unique_fields=["gpu", "bucket"],
        update_fields=fields,
        batch_size=500,
    )


# --- Retention --------------------------------------------------------------


@dataclass(frozen=True)
class PruneResult:
    raw: int
    minutes: int
    hours: int
    done: bool


def telemetry_prune(
    *, now: datetime | None = None, batch_size: int = PRUNE_BATCH, max_batches: int = 50
) -> PruneResult:
    """Delete telemetry older than the retention policy, at most `max_batches` batches per table.

    Nothing is deleted before it is rolled up: raw samples wait for the minute cursor
    and minutes for the hour cursor, so a beat that was down loses no history.
    """
    now = now or timezone.now()
    policy = RetentionPolicy.current()
    cursors = dict(RollupCursor.objects.values_list("level", "done_until"))
    minute_done, hour_done = cursors.get("minute"), cursors.get("hour")

    raw_cutoff = None
    if minute_done is not None:
        raw_cutoff = min(now - timedelta(days=policy.raw_days), minute_done - LATE_WINDOW)
    minute_cutoff = None
    if hour_done is not None:
        minute_cutoff = min(
            now - timedelta(days=policy.minute_days), floor_to(hour_done - LATE_WINDOW, HOUR)
        )
    hour_cutoff = now - timedelta(days=policy.hour_days) if policy.hour_days else None

    budget = [max_batches]
    raw = _delete_before(GpuSample, "ts", raw_cutoff, batch_size, budget)
    minutes = _delete_before(GpuMinuteRollup, "bucket", minute_cutoff, batch_size, budget)
    hours = _delete_before(GpuHourRollup, "bucket", hour_cutoff, batch_size, budget)
    return PruneResult(raw=raw, minutes=minutes, hours=hours, done=budget[0] > 0)


def _delete_before(
    model: type[models.Model],
    field: str,
    cutoff: datetime | None,
    batch_size: int,
    budget: list[int],
) -> int:
    """Delete rows with `field` before `cutoff`, one short transaction per batch."""
    if cutoff is None:
        return 0
    deleted = 0
    manager = model._default_manager
    while budget[0] > 0:
        ids = list(
            manager.filter(**{f"{field}__lt": cutoff}).values_list("pk", flat=True)[:batch_size]
        )
        if not ids:
            break
        budget[0] -= 1
        with transaction.atomic():
            count, _per_model = manager.filter(pk__in=ids).delete()
        deleted += count
        if len(ids) < batch_size:
            break
    return deleted

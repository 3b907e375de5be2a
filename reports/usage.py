"""Usage per user, category, queue, node, GPU model and project: allocated GPU-hours and jobs by
final state from the period's job table, used GPU-hours from telemetry (the rollups,
then raw samples for what they have not reached), credits from the ledger, and the
bookings per user."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from decimal import Decimal

from django.db.models import Count, F, Sum

from accounts.models import LedgerEntry
from reports.jobtable import (
    DIMENSION_FIELDS,
    ROLLUP_DIMENSION_FIELDS,
    JobTable,
    LabNames,
    first_gpu_on_mixed_nodes,
    job_groups,
    period_jobs,
    runs_in,
)
from reports.lines import DIMENSIONS, FINAL_STATES, LAB_TOTALS, BookingLine, UsageLine
from reports.periods import Period
from reports.utilisation import TelemetryWindows, raw_job_means, rollup_usage
from reports.weeks import WeekGrid
from reservations.models import Reservation

SPENDING_KINDS = (
    LedgerEntry.Kind.CHARGE,
    LedgerEntry.Kind.REFUND,
    LedgerEntry.Kind.RESERVATION,
    LedgerEntry.Kind.NO_SHOW,
)


def _overlap_h(a0: dt.datetime, a1: dt.datetime, b0: dt.datetime, b1: dt.datetime) -> float:
    return max(0.0, (min(a1, b1) - max(a0, b0)).total_seconds() / 3600)


def usage_tables(
    period: Period,
    end: dt.datetime,
    windows: TelemetryWindows,
    names: LabNames,
    raw_usage: dict[tuple[str, ...], list[float]],
    table: JobTable,
) -> tuple[UsageLine, dict[str, dict[str, UsageLine]]]:
    """Allocated GPU-hours and jobs by final state per user, category, queue, node and GPU
    model, summed per (owner, queue, node, first GPU) from the period's job table (one row
    per job, read once for every figure of the jobs); used GPU-hours from telemetry."""
    totals = UsageLine(LAB_TOTALS)
    tables: dict[str, dict[str, UsageLine]] = {d: {} for d in DIMENSIONS}

    def lines_of(keys: tuple[str, ...]) -> list[UsageLine]:
        return [totals] + [
            tables[d].setdefault(key, UsageLine(key))
            for d, key in zip(DIMENSIONS, keys, strict=True)
        ]

    for owner, queue, node, gpu, project, alloc_s, counts in job_groups(period, end, table):
        lines = lines_of(names.keys(owner, queue, node, names.model_of(node, gpu), project))
        hours = alloc_s / 3600
        for line in lines:
            line.gpu_hours += hours
            for state, n in zip(FINAL_STATES, counts, strict=True):
                if n:
                    line.jobs[state] += n
    telemetry: dict[tuple[str, ...], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for (user, queue, node, model, project), (used, measured) in rollup_usage(
        windows, **ROLLUP_DIMENSION_FIELDS
    ).items():
        keys = names.keys(user, queue, node, model, project)
        telemetry[keys][0] += used
        telemetry[keys][1] += measured
    for keys, (used, measured) in raw_usage.items():
        telemetry[keys][0] += used
        telemetry[keys][1] += measured
    for keys, (used, measured) in telemetry.items():
        for line in lines_of(keys):
            line.used_gpu_hours += used
            line.measured_gpu_hours += measured
    return totals, tables


def raw_sample_usage(
    period: Period, end: dt.datetime, windows: TelemetryWindows, names: LabNames
) -> tuple[dict[tuple[str, ...], list[float]], dict[dt.date, tuple[float, float]]]:
    """Used and measured GPU-hours of the part no rollup covers yet, per dimension key and
    per week: each job's mean raw utilisation there weighs its GPU-hours there."""
    if windows.raw is None:
        return {}, {}
    means = raw_job_means(windows.raw)
    if not means:
        return {}, {}
    a, b = windows.raw
    grid = WeekGrid(period.start, end)
    rows = (
        period_jobs(period, names)
        .filter(runs_in(a, b))
        .values_list("pk", "units", "started_at", "ended_at", *DIMENSION_FIELDS, named=True)
    )
    by_key: dict[tuple[str, ...], list[float]] = {}
    by_week: dict[dt.date, tuple[float, float]] = defaultdict(lambda: (0.0, 0.0))
    for row in rows.iterator(chunk_size=10_000):
        mean = means.get(row.pk)
        started, units = row.started_at, row.units
        if mean is None or started is None:
            continue
        run_end = row.ended_at or b
        hours = units * _overlap_h(started, run_end, a, b)
        model = names.model_of(row.node_id, row.alloc_gpu)
        keys = names.keys(row.owner_id, row.queue_id, row.node_id, model, row.project_id)
        line_sums = by_key.setdefault(keys, [0.0, 0.0])
        line_sums[0] += hours * mean
        line_sums[1] += hours
        r0, r1 = max(started, a), min(run_end, b)
        for monday, w0, w1 in grid.spanning(r0, r1):
            covered = units * _overlap_h(r0, r1, w0, w1)
            used_so_far, measured_so_far = by_week[monday]
            by_week[monday] = (used_so_far + covered * mean, measured_so_far + covered)
    return by_key, dict(by_week)


def spent_credits(period: Period, names: LabNames) -> tuple[dict[str, dict[str, float]], float]:
    """Credits spent in the period per dimension and value, and in total (charges net of
    refunds): one GROUP BY, rolled up into the five dimensions here."""
    entries = (
        LedgerEntry.objects.filter(
            created_at__gte=period.start, created_at__lt=period.end, kind__in=SPENDING_KINDS
        )
        .order_by()
        .annotate(gpu=first_gpu_on_mixed_nodes(names, "job_id", "job__node_id"))
    )
    spent: dict[str, dict[str, float]] = {d: defaultdict(float) for d in DIMENSIONS}
    total = 0.0
    rows = entries.values(
        "account__user_id", "job__queue_id", "job__node_id", "gpu", "job__project_id"
    ).annotate(amount=Sum("amount"))
    for row in rows:
        amount = -float(row["amount"] or Decimal(0))
        total += amount
        model = names.model_of(row["job__node_id"], row["gpu"])
        keys = names.keys(
            row["account__user_id"],
            row["job__queue_id"],
            row["job__node_id"],
            model,
            row["job__project_id"],
        )
        # Every job has a queue: an entry without one is not a job's (a booking's, say).
        dimensions = DIMENSIONS if row["job__queue_id"] is not None else DIMENSIONS[:2]
        for dimension, key in zip(dimensions, keys, strict=False):
            spent[dimension][key] += amount
    return spent, 0.0 + total  # 0.0 + x: never a negative zero


def booking_usage(period: Period, end: dt.datetime) -> dict[str, BookingLine]:
    lines: dict[str, BookingLine] = {}
    reservations = (
        Reservation.objects.filter(start__lt=period.end, end__gt=period.start, is_maintenance=False)
        .exclude(state=Reservation.State.CANCELLED)
        .order_by()
        .annotate(gpu_count=Count("gpus"), booked=F("booked_end"))
        .values_list("user__username", "start", "end", "booked", "no_show", "gpu_count")
    )
    for user, r_start, r_end, booked_end, no_show, n in reservations:
        line = lines.setdefault(user, BookingLine(user))
        booked_until = max(booked_end or r_end, r_end)
        booked = n * _overlap_h(r_start, booked_until, period.start, period.end)
        line.bookings += 1
        line.booked_h += booked
        line.released_h += n * _overlap_h(r_end, booked_until, period.start, period.end)
        if no_show:
            line.no_show_h += n * _overlap_h(r_start, r_end, period.start, min(period.end, end))
    return lines

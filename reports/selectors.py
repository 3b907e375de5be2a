"""The usage report of a period: read from jobs, credits, reservations and telemetry.

Figures are GPU-hours of whole GPUs (a shared slot counts as its share of its GPU).
"Really used" GPU-hours come from telemetry (`reports.utilisation`: hourly rollups, then
minute rollups, then raw samples for what the rollups have not reached); GPU-hours
without telemetry count as allocated but not in the used figure or the mean utilisation.

The jobs are read once, as one row of numbers per job (`JobTable`: packed as float8 by
PostgreSQL), and every figure of the jobs comes from that array: allocated GPU-hours and
final states per (owner, queue, node, GPU), per week, waits (percentiles need every
wait) and unmet demand (a sweep over time). Telemetry and credits are summed by the
database per group (the rollups per dimension and per bucket, the ledger per dimension).

This module puts the report together; its parts: `reports.lines` (the report's lines),
`reports.jobtable` (the period's jobs as numbers, and the names they are grouped by),
`reports.usage` (per user, category, queue, node and model; credits; bookings),
`reports.weeks` (the weeks and their figures, unmet demand among them), `reports.waits`
(waits per queue) and `reports.sql` (the database plumbing).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from django.utils import timezone

from accounts.models import Category, User
from cluster.models import Gpu
from reports.jobtable import job_table, lab_names
from reports.lines import LAB_TOTALS, BookingLine, UsageLine, UsageReport
from reports.periods import Period
from reports.sql import without_jit
from reports.usage import booking_usage, raw_sample_usage, spent_credits, usage_tables
from reports.utilisation import telemetry_windows
from reports.waits import queue_waits
from reports.weeks import unmet_demand, usage_weeks


def _is_empty_placeholder(line: UsageLine) -> bool:
    """A "—" line (jobs with no node or GPU model: cancelled before they ran) that holds
    no GPU-hours and no credits: a row of zeros a reader would only wonder about."""
    return (
        line.name == "—"
        and line.gpu_hours == 0
        and line.used_gpu_hours == 0
        and abs(line.credits) < 0.005
    )


def _sorted_lines(lines: Iterable[UsageLine]) -> list[UsageLine]:
    kept = (line for line in lines if not _is_empty_placeholder(line))
    return sorted(kept, key=lambda line: (-line.gpu_hours, line.name))


def usage_report(*, period: Period, viewer: User, now: dt.datetime | None = None) -> UsageReport:
    """The usage report of `period` as `viewer` may see it.

    Staff see every line; anyone else sees the lab totals, the lab-wide tables (queues,
    nodes, GPU models, waits, weeks) and only their own user and booking lines.
    """
    with without_jit():
        return _usage_report(period=period, viewer=viewer, now=now)


def _usage_report(*, period: Period, viewer: User, now: dt.datetime | None) -> UsageReport:
    now = now or timezone.now()
    end = min(period.end, max(now, period.start))
    capacity = Gpu.objects.filter(kind=Gpu.Kind.WHOLE).count()
    windows = telemetry_windows(start=period.start, end=end)
    names = lab_names()
    raw_by_key, raw_by_week = raw_sample_usage(period, end, windows, names)
    table = job_table(period, names)
    totals, tables = usage_tables(period, end, windows, names, raw_by_key, table)
    spent, spent_total = spent_credits(period, names)
    for dimension, values in spent.items():
        for value, amount in values.items():
            tables[dimension].setdefault(value, UsageLine(value)).credits += amount
    totals.credits = spent_total
    weeks = usage_weeks(period, end, capacity, windows, raw_by_week, table.jobs)
    unmet_demand(table.jobs, capacity, period.start, end, weeks)
    waits = queue_waits(period, table, names.queues)

    bookings = booking_usage(period, end)
    bookings_total = BookingLine(LAB_TOTALS)
    for booking in bookings.values():
        bookings_total.bookings += booking.bookings
        bookings_total.booked_h += booking.booked_h
        bookings_total.released_h += booking.released_h
        bookings_total.no_show_h += booking.no_show_h

    scoped_to = None if viewer.is_staff else viewer.username
    result_tables = {d: _sorted_lines(lines.values()) for d, lines in tables.items()}
    booking_lines = sorted(bookings.values(), key=lambda b: (-b.booked_h, b.user))
    if scoped_to is not None:
        result_tables["user"] = [line for line in result_tables["user"] if line.name == scoped_to]
        del result_tables["category"]  # a small category would name its members
        booking_lines = [b for b in booking_lines if b.user == scoped_to]
    return UsageReport(
        period=period,
        capacity_gpus=capacity,
        totals=totals,
        tables=result_tables,
        waits=waits,
        weeks=[weeks[m] for m in sorted(weeks)],
        bookings=booking_lines,
        bookings_total=bookings_total,
        scoped_to=scoped_to,
        category_names_zh=_category_names_zh() if "category" in result_tables else {},
    )


def _category_names_zh() -> dict[str, str]:
    return dict(Category.objects.exclude(name_zh_hans="").values_list("name", "name_zh_hans"))

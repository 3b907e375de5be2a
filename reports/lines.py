"""The lines of a usage report, and the report: what `reports.selectors.usage_report`
hands to the pages, the exports and the PDF (`as_dict` gives a line's exported row)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from core.i18n import in_reader_language
from jobqueue.models import Job
from reports.periods import Period

FINAL_STATES: tuple[str, ...] = tuple(str(s) for s in Job.FINAL_STATES)
DIMENSIONS = ("user", "category", "queue", "node", "model", "project")
NO_CATEGORY = "—"
NO_PROJECT = "—"
# The name of the lab's totals line (and of the bookings' last row) in the CSV and the API;
# the pages say it in words (reports.tables).
LAB_TOTALS = "lab"


def _pct(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _coverage(measured: float, allocated: float) -> float | None:
    if allocated <= 0:
        return None
    return min(100.0, 100.0 * measured / allocated)


@dataclass
class UsageLine:
    """One row of a usage table: what one user (category, queue, node, model) got."""

    name: str
    gpu_hours: float = 0.0
    used_gpu_hours: float = 0.0
    # Allocated GPU-hours of jobs that have telemetry: the mean utilisation's denominator.
    measured_gpu_hours: float = 0.0
    jobs: Counter[str] = field(default_factory=Counter)
    credits: float = 0.0

    @property
    def mean_util_pct(self) -> float | None:
        if self.measured_gpu_hours <= 0:
            return None
        return 100.0 * self.used_gpu_hours / self.measured_gpu_hours

    @property
    def coverage_pct(self) -> float | None:
        """The share of the allocated GPU-hours that had telemetry: what the mean rests on."""
        return _coverage(self.measured_gpu_hours, self.gpu_hours)

    @property
    def jobs_total(self) -> int:
        return sum(self.jobs.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gpu_hours": round(self.gpu_hours, 2),
            "used_gpu_hours": round(self.used_gpu_hours, 2),
            "coverage_pct": _pct(self.coverage_pct),
            "mean_util_pct": _pct(self.mean_util_pct),
            **{f"jobs_{state}": self.jobs.get(state, 0) for state in FINAL_STATES},
            "credits": round(self.credits, 2),
        }


@dataclass
class WaitLine:
    queue: str
    jobs: int
    mean_h: float
    p50_h: float
    p95_h: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "jobs_started": self.jobs,
            "wait_mean_h": round(self.mean_h, 2),
            "wait_p50_h": round(self.p50_h, 2),
            "wait_p95_h": round(self.p95_h, 2),
        }


@dataclass
class WeekLine:
    """Lab-wide figures of one week (clipped to the period and to now)."""

    week: dt.date
    capacity_gpu_hours: float = 0.0
    gpu_hours: float = 0.0
    used_gpu_hours: float = 0.0
    # Allocated GPU-hours with telemetry: `used_gpu_hours` is measured over these only.
    measured_gpu_hours: float = 0.0
    unmet_gpu_hours: float = 0.0

    @property
    def allocation_pct(self) -> float | None:
        return (
            None if self.capacity_gpu_hours <= 0 else 100 * self.gpu_hours / self.capacity_gpu_hours
        )

    @property
    def coverage_pct(self) -> float | None:
        return _coverage(self.measured_gpu_hours, self.gpu_hours)

    @property
    def mean_util_pct(self) -> float | None:
        """How busy the allocated GPUs were, over the time that had telemetry only: a
        GPU-hour without samples is unknown, not idle."""
        if self.measured_gpu_hours <= 0:
            return None
        return 100 * self.used_gpu_hours / self.measured_gpu_hours

    def as_dict(self) -> dict[str, Any]:
        pct = _pct
        return {
            "week": self.week.isoformat(),
            "capacity_gpu_hours": round(self.capacity_gpu_hours, 2),
            "gpu_hours": round(self.gpu_hours, 2),
            "allocation_pct": pct(self.allocation_pct),
            "used_gpu_hours": round(self.used_gpu_hours, 2),
            "coverage_pct": pct(self.coverage_pct),
            "mean_util_pct": pct(self.mean_util_pct),
            "unmet_gpu_hours": round(self.unmet_gpu_hours, 2),
        }


@dataclass
class BookingLine:
    user: str
    bookings: int = 0
    booked_h: float = 0.0
    released_h: float = 0.0
    no_show_h: float = 0.0

    @property
    def used_h(self) -> float:
        return self.booked_h - self.released_h - self.no_show_h

    def as_dict(self) -> dict[str, Any]:
        return {
            "user": self.user,
            "bookings": self.bookings,
            "booked_gpu_hours": round(self.booked_h, 2),
            "used_gpu_hours": round(self.used_h, 2),
            "released_gpu_hours": round(self.released_h, 2),
            "no_show_gpu_hours": round(self.no_show_h, 2),
        }


@dataclass
class UsageReport:
    period: Period
    capacity_gpus: int
    totals: UsageLine
    tables: dict[str, list[UsageLine]]
    waits: list[WaitLine]
    weeks: list[WeekLine]
    bookings: list[BookingLine]
    bookings_total: BookingLine
    scoped_to: str | None = None  # a member's username: only their own lines are in
    # The categories' Chinese names by their English ones, which name the category lines.
    category_names_zh: dict[str, str] = field(default_factory=dict)

    @property
    def unmet_gpu_hours(self) -> float:
        return sum(w.unmet_gpu_hours for w in self.weeks)

    def category_name(self, name: str) -> str:
        """A category line's name as the pages show it: in the reader's language."""
        return in_reader_language(name, self.category_names_zh.get(name, ""))

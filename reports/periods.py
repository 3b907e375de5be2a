"""Report periods: a month, a quarter, a year or a custom range, as half-open [start, end)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from django.utils import timezone
from django.utils.translation import gettext as _

from reports.errors import BadPeriod

KINDS = ("month", "quarter", "year", "custom")
MAX_DAYS = 3 * 366


@dataclass(frozen=True)
class Period:
    """Whole days in the server's time zone; `end` is the first moment after the period."""

    kind: str
    start: dt.datetime
    end: dt.datetime

    @property
    def first_day(self) -> dt.date:
        return timezone.localtime(self.start).date()

    @property
    def last_day(self) -> dt.date:
        return timezone.localtime(self.end).date() - dt.timedelta(days=1)

    @property
    def hours(self) -> float:
        return (self.end - self.start).total_seconds() / 3600

    @property
    def label(self) -> str:
        return f"{self.first_day.isoformat()} – {self.last_day.isoformat()}"

    def query(self) -> str:
        """The GET parameters that name this period (for links to CSV, PDF and the API)."""
        return f"period=custom&from={self.first_day.isoformat()}&to={self.last_day.isoformat()}"


def _midnight(day: dt.date) -> dt.datetime:
    return timezone.make_aware(dt.datetime.combine(day, dt.time.min))


def period_of(kind: str, first: dt.date, last: dt.date) -> Period:
    if last < first:
        raise BadPeriod(_("The period ends before it starts: put the earlier date in “from”."))
    if (last - first).days + 1 > MAX_DAYS:
        raise BadPeriod(_("A report covers at most three years: choose a shorter period."))
    return Period(kind, _midnight(first), _midnight(last + dt.timedelta(days=1)))


def _parse_date(value: str, field: str) -> dt.date:
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise BadPeriod(
            _("“%(field)s” must be a date written YYYY-MM-DD, got “%(value)s”.")
            % {"field": field, "value": value[:40]}
        ) from None


def period_from_params(params: Mapping[str, str], *, today: dt.date | None = None) -> Period:
    """Read `period` (month | quarter | year | custom) and, for custom, `from` and `to`.

    Month, quarter and year are the calendar ones containing `at` (default: today);
    without `period`, the last 90 days.
    """
    today = today or timezone.localdate()
    if not params.get("period"):
        # The last 90 days: a default that always has history in it, whatever the date.
        return period_of("custom", today - dt.timedelta(days=89), today)
    kind = params["period"]
    if kind not in KINDS:
        raise BadPeriod(
            _("“period” must be one of month, quarter, year or custom, got “%(value)s”.")
            % {"value": kind[:40]}
        )
    if kind == "custom":
        if not params.get("from") or not params.get("to"):
            raise BadPeriod(_("A custom period needs both “from” and “to” (YYYY-MM-DD)."))
        return period_of(kind, _parse_date(params["from"], "from"), _parse_date(params["to"], "to"))
    at = _parse_date(params["at"], "at") if params.get("at") else today
    if kind == "month":
        first = at.replace(day=1)
        nxt = (first + dt.timedelta(days=32)).replace(day=1)
    elif kind == "quarter":
        first = at.replace(month=(at.month - 1) // 3 * 3 + 1, day=1)
        nxt = (first + dt.timedelta(days=95)).replace(day=1)
    else:
        first = at.replace(month=1, day=1)
        nxt = first.replace(year=first.year + 1)
    return period_of(kind, first, nxt - dt.timedelta(days=1))

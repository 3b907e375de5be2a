"""What a funding panel reads first: who the lab is, what it owns, and one paragraph with
the period's headline figures, how they changed since the lab's rules came in, and the
demand forecast. Every figure comes from the report itself (`reports.selectors`), so the
paragraph never disagrees with the tables under it."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field

from django.db.models import Count
from django.utils import timezone
from django.utils.formats import date_format, number_format
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from accounts.models import User
from cluster.models import Gpu, Node
from core.durations import hours_minutes
from core.i18n import join_sentences
from reports.forecast import Forecast
from reports.lines import UsageReport
from reports.models import LabProfile
from reports.periods import Period, period_of
from reports.selectors import usage_report


@dataclass(frozen=True)
class InventoryLine:
    """One server of the lab: its GPUs by model, and when and with what it was bought."""

    node: str
    gpus: int
    models: list[tuple[str, int]]
    purchased_on: dt.date | None
    funded_by: str

    @property
    def models_label(self) -> str:
        return ", ".join(f"{n} × {model}" for model, n in self.models)


def inventory() -> list[InventoryLine]:
    """The lab's servers with whole GPUs, as an admin entered their purchase."""
    per_node: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for row in (
        Gpu.objects.filter(kind=Gpu.Kind.WHOLE)
        .values("node_id", "model")
        .annotate(n=Count("id"))
        .order_by("node_id", "model")
    ):
        per_node[row["node_id"]].append((row["model"], row["n"]))
    return [
        InventoryLine(
            node=node.name,
            gpus=sum(n for _model, n in per_node[node.pk]),
            models=per_node[node.pk],
            purchased_on=node.purchased_on,
            funded_by=node.funded_by,
        )
        for node in Node.objects.order_by("name")
        if per_node.get(node.pk)
    ]


@dataclass(frozen=True)
class Headline:
    """The figures the summary quotes, from one report."""

    allocated_gpu_hours: float
    capacity_gpu_hours: float
    coverage_pct: float | None
    util_pct: float | None
    jobs_finished: int
    jobs_started: int
    mean_wait_h: float | None
    unmet_gpu_hours: float

    @property
    def allocation_pct(self) -> float | None:
        if self.capacity_gpu_hours <= 0:
            return None
        return 100.0 * self.allocated_gpu_hours / self.capacity_gpu_hours

    @classmethod
    def of(cls, report: UsageReport) -> Headline:
        started = sum(w.jobs for w in report.waits)
        return cls(
            allocated_gpu_hours=report.totals.gpu_hours,
            capacity_gpu_hours=sum(w.capacity_gpu_hours for w in report.weeks),
            coverage_pct=report.totals.coverage_pct,
            util_pct=report.totals.mean_util_pct,
            jobs_finished=report.totals.jobs_total,
            jobs_started=started,
            mean_wait_h=sum(w.mean_h * w.jobs for w in report.waits) / started if started else None,
            unmet_gpu_hours=report.unmet_gpu_hours,
        )


@dataclass(frozen=True)
class Comparison:
    """The same figures over equal spans before and after the day the rules came in."""

    since: dt.date
    before_period: Period
    after_period: Period
    before: Headline
    after: Headline


@dataclass
class Narrative:
    lab_name: str
    institution: str
    inventory: list[InventoryLine]
    headline: Headline
    comparison: Comparison | None
    sentences: list[str] = field(default_factory=list)

    @property
    def paragraph(self) -> str:
        # Chinese sentences follow each other without a space; English ones with one.
        return join_sentences(self.sentences)

    @property
    def purchases_known(self) -> bool:
        return any(line.purchased_on for line in self.inventory)

    @property
    def servers(self) -> int:
        return len(self.inventory)

    @property
    def gpus(self) -> int:
        return sum(line.gpus for line in self.inventory)


def _num(value: float, digits: int = 1) -> str:
    return number_format(round(value, digits), digits, use_l10n=True, force_grouping=True)


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{_num(value)}%"


def _day(day: dt.date) -> str:
    return date_format(day, "DATE_FORMAT", use_l10n=True)


def _wait(hours: float | None) -> str:
    return "—" if hours is None else hours_minutes(hours * 3600)


def comparison(
    *, report: UsageReport, since: dt.date | None, viewer: User, now: dt.datetime | None = None
) -> Comparison | None:
    """The period after `since` (the rules' first day) against as many days just before it;
    None when the period ends before that day, or nothing ran in the days before it."""
    period = report.period
    today = timezone.localdate(now) if now else timezone.localdate()
    last = min(period.last_day, today)
    if since is None or since > last:
        return None
    after_period = period_of("custom", max(period.first_day, since), last)
    days = (after_period.last_day - after_period.first_day).days + 1
    before_period = period_of(
        "custom", since - dt.timedelta(days=days), since - dt.timedelta(days=1)
    )
    before = usage_report(period=before_period, viewer=viewer, now=now)
    if before.totals.gpu_hours <= 0 and not before.waits:
        return None
    after = (
        report
        if after_period == period
        else usage_report(period=after_period, viewer=viewer, now=now)
    )
    return Comparison(since, before_period, after_period, Headline.of(before), Headline.of(after))


def narrative(
    *,
    report: UsageReport,
    viewer: User,
    forecast: Forecast | None,
    now: dt.datetime | None = None,
) -> Narrative:
    """The report's opening paragraph, in the reader's language."""
    profile = LabProfile.current()
    lines = inventory()
    head = Headline.of(report)
    compared = comparison(report=report, since=profile.rules_since, viewer=viewer, now=now)
    story = Narrative(
        lab_name=profile.display_name or _("The lab"),
        institution=profile.display_institution,
        inventory=lines,
        headline=head,
        comparison=compared,
    )
    story.sentences = _sentences(story, report, forecast)
    return story


def _sentences(story: Narrative, report: UsageReport, forecast: Forecast | None) -> list[str]:
    head = story.headline
    period = report.period
    if not story.gpus:
        return [_("%(lab)s has no GPU servers in LabPortal yet.") % {"lab": story.lab_name}]
    servers = ngettext("%(servers)s server", "%(servers)s servers", story.servers) % {
        "servers": story.servers
    }
    said = [
        ngettext(
            "%(lab)s shares %(gpus)s GPU on %(servers)s through LabPortal.",
            "%(lab)s shares %(gpus)s GPUs on %(servers)s through LabPortal.",
            story.gpus,
        )
        % {"lab": story.lab_name, "gpus": story.gpus, "servers": servers}
    ]
    if head.allocation_pct is not None:
        said.append(
            _(
                "From %(first)s to %(last)s its members were allocated %(hours)s GPU-hours, "
                "%(allocation)s of what the GPUs could give."
            )
            % {
                "first": _day(period.first_day),
                "last": _day(period.last_day),
                "hours": _num(head.allocated_gpu_hours),
                "allocation": _pct(head.allocation_pct),
            }
        )
    if head.coverage_pct is not None and head.util_pct is not None:
        said.append(
            _(
                "Telemetry covered %(coverage)s of that time, and over it the allocated GPUs "
                "were %(util)s busy (real utilisation)."
            )
            % {"coverage": _pct(head.coverage_pct), "util": _pct(head.util_pct)}
        )
    elif head.allocated_gpu_hours > 0:
        said.append(_("No telemetry covered that time, so real utilisation is not known."))
    if head.jobs_started:
        said.append(
            ngettext(
                "%(jobs)s job started after a mean wait of %(wait)s; %(unmet)s GPU-hours of "
                "demand waited for a free GPU.",
                "%(jobs)s jobs started after a mean wait of %(wait)s; %(unmet)s GPU-hours of "
                "demand waited for a free GPU.",
                head.jobs_started,
            )
            % {
                "jobs": head.jobs_started,
                "wait": _wait(head.mean_wait_h),
                "unmet": _num(head.unmet_gpu_hours),
            }
        )
    compared = story.comparison
    if compared is not None:
        before, after = compared.before, compared.after
        said.append(
            _(
                "Since the lab's rules came in on %(since)s, allocation went from "
                "%(a0)s to %(a1)s, real utilisation from %(u0)s to %(u1)s and the mean wait "
                "from %(w0)s to %(w1)s (%(b0)s – %(b1)s against %(f0)s – %(f1)s)."
            )
            % {
                "since": _day(compared.since),
                "a0": _pct(before.allocation_pct),
                "a1": _pct(after.allocation_pct),
                "u0": _pct(before.util_pct),
                "u1": _pct(after.util_pct),
                "w0": _wait(before.mean_wait_h),
                "w1": _wait(after.mean_wait_h),
                "b0": _day(compared.before_period.first_day),
                "b1": _day(compared.before_period.last_day),
                "f0": _day(compared.after_period.first_day),
                "f1": _day(compared.after_period.last_day),
            }
        )
    if forecast is not None and forecast.mean:
        weekly = sum(forecast.mean) / len(forecast.mean)
        said.append(
            ngettext(
                "Demand is forecast at %(demand)s GPU-hours a week for the next %(weeks)s "
                "week, against %(capacity)s GPU-hours a week that the lab's GPUs can give.",
                "Demand is forecast at %(demand)s GPU-hours a week for the next %(weeks)s "
                "weeks, against %(capacity)s GPU-hours a week that the lab's GPUs can give.",
                len(forecast.mean),
            )
            % {
                "demand": _num(weekly),
                "weeks": len(forecast.mean),
                "capacity": _num(report.capacity_gpus * 7 * 24, 0),
            }
        )
    return said

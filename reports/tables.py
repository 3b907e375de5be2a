"""The report as named tables: one definition that the page, the PDF, the CSV and the API share.

Each table has a slug (its CSV file and API key), a title and columns; every cell
is computed once, in `UsageLine.as_dict` and its siblings, so no two outputs can
disagree about a figure.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from typing import Any

from django.utils.formats import number_format
from django.utils.functional import Promise
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from core.i18n import join_sentences
from reports.lines import FINAL_STATES, NO_PROJECT, UsageReport

STATE_LABELS: dict[str, Promise] = {
    "completed": _("completed"),
    "failed": _("failed"),
    "cancelled": _("cancelled"),
    "timed_out": _("timed out"),
    "lost": _("lost"),
}

USAGE_COLUMNS: list[tuple[str, Promise]] = [
    ("gpu_hours", _("GPU-hours allocated")),
    ("used_gpu_hours", _("GPU-hours really used")),
    ("coverage_pct", _("Telemetry coverage %")),
    ("mean_util_pct", _("Mean utilisation %")),
    *[(f"jobs_{state}", STATE_LABELS[state]) for state in FINAL_STATES],
    ("credits", _("Credits spent")),
]

USAGE_TABLES: list[tuple[str, Promise, Promise]] = [
    ("user", _("Per user"), _("User")),
    ("category", _("Per user category"), _("Category")),
    ("queue", _("Per queue"), _("Queue")),
    ("node", _("Per node"), _("Node")),
    ("model", _("Per GPU model"), _("GPU model")),
    ("project", _("Per project"), _("Project")),
]

SLUGS = ("totals", *(slug for slug, _t, _n in USAGE_TABLES), "waits", "weeks", "bookings")


# How the pages name the lab's totals row, which the CSV and the API call LAB_TOTALS.
LAB_TOTALS_SHOWN = _("whole lab")


@dataclass
class Table:
    slug: str
    title: str | Promise
    columns: list[tuple[str, str | Promise]]
    rows: list[dict[str, Any]]
    note: str = ""  # why the table's figures do not add up to the lab total, where they don't
    # What the pages show in a row's first cell in place of its value, by row (None: the
    # value): the lab's totals in words, a category's name in the reader's language. The
    # CSV and the API keep the values.
    shown_names: list[str | Promise | None] = field(default_factory=list)

    def csv_text(self) -> str:
        """The table as CSV: a header of column keys, then one line per row."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        keys = [key for key, _label in self.columns]
        writer.writerow(keys)
        for row in self.rows:
            writer.writerow(["" if row[k] is None else row[k] for k in keys])
        return out.getvalue()

    def cells(self) -> list[list[Any]]:
        """Rows as lists in column order, for templates, with the first cells as shown."""
        cells = []
        for i, row in enumerate(self.rows):
            values = [row[key] for key, _label in self.columns]
            shown = self.shown_names[i] if i < len(self.shown_names) else None
            if shown is not None:
                values[0] = shown
            cells.append(values)
        return cells


def report_tables(report: UsageReport) -> list[Table]:
    """Every table of the report, in page order; a member's report lacks the category table."""
    tables = [
        Table(
            "totals",
            _("Lab totals"),
            [("name", _("Lab")), *USAGE_COLUMNS],
            [report.totals.as_dict()],
            shown_names=[LAB_TOTALS_SHOWN],
        )
    ]
    for slug, title, name_label in USAGE_TABLES:
        if slug == "project" and all(line.name == NO_PROJECT for line in report.tables[slug]):
            continue  # no job was charged to a project: a table of one "—" row says nothing
        if slug in report.tables:
            lines = report.tables[slug]
            tables.append(
                Table(
                    slug,
                    title,
                    [("name", name_label), *USAGE_COLUMNS],
                    [line.as_dict() for line in lines],
                    note=_table_note(report, slug),
                    shown_names=[report.category_name(line.name) for line in lines]
                    if slug == "category"
                    else [],
                )
            )
    tables.append(
        Table(
            "waits",
            _("Waits per queue"),
            [
                ("queue", _("Queue")),
                ("jobs_started", _("Jobs started")),
                ("wait_mean_h", _("Mean wait (h)")),
                ("wait_p50_h", _("Median wait, p50 (h)")),
                ("wait_p95_h", _("p95 wait (h)")),
            ],
            [line.as_dict() for line in report.waits],
        )
    )
    tables.append(
        Table(
            "weeks",
            _("Weekly trends"),
            [
                ("week", _("Week of")),
                ("capacity_gpu_hours", _("Capacity (GPU-hours)")),
                ("gpu_hours", _("GPU-hours allocated")),
                ("allocation_pct", _("Allocation %")),
                ("used_gpu_hours", _("GPU-hours really used")),
                ("coverage_pct", _("Telemetry coverage %")),
                ("mean_util_pct", _("Mean utilisation %")),
                ("unmet_gpu_hours", _("Unmet demand (GPU-hours)")),
            ],
            [line.as_dict() for line in report.weeks],
        )
    )
    tables.append(
        Table(
            "bookings",
            _("Bookings"),
            [
                ("user", _("User")),
                ("bookings", _("Bookings")),
                ("booked_gpu_hours", _("Booked (GPU-hours)")),
                ("used_gpu_hours", _("Used (GPU-hours)")),
                ("released_gpu_hours", _("Released early (GPU-hours)")),
                ("no_show_gpu_hours", _("No-shows (GPU-hours)")),
            ],
            [line.as_dict() for line in report.bookings] + [report.bookings_total.as_dict()],
            shown_names=[*(None for _line in report.bookings), LAB_TOTALS_SHOWN],
        )
    )
    return tables


def _table_note(report: UsageReport, slug: str) -> str:
    notes = [_credits_note(report, slug)]
    if slug == "project" and any(line.name == NO_PROJECT for line in report.tables[slug]):
        notes.append(gettext("“—” is the work charged to no project."))
    return join_sentences(notes)


def _credits_note(report: UsageReport, slug: str) -> str:
    """Why a table's credits fall short of the lab total: bookings, no-shows and plain
    sbatch jobs are charged to a member, never to a queue, a node, a GPU model or a project."""
    if slug not in ("queue", "node", "model", "project"):
        return ""
    gap = report.totals.credits - sum(line.credits for line in report.tables[slug])
    if abs(gap) < 0.05:
        return ""
    return gettext(
        "%(credits)s credits of the lab total are not a portal job's (bookings, no-shows, "
        "jobs submitted to Slurm directly), so no queue, node, GPU model or project has "
        "them; this table's credits add up to the total without them."
    ) % {"credits": number_format(round(gap, 1), 1, use_l10n=True, force_grouping=True)}


def table_by_slug(report: UsageReport, slug: str) -> Table | None:
    return next((t for t in report_tables(report) if t.slug == slug), None)

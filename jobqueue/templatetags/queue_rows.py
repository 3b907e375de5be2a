"""The queue page's rows and a job's estimated start, built in Python.

A page of 100 waiting and 64 running jobs rendered through template tags per cell cost
about three quarters of the page's CPU (a thousand includes, urls, filters and
translations). Here each row is one string built from the job's fields, everything
worded or reversed once per page is done once, and every value from the database is
escaped. The markup is what the templates made: ``data-label`` on each cell (the phone
layout reads it), ``mine`` on the reader's own rows, links only where the reader may open
the job."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django import template
from django.urls import reverse
from django.utils import formats, timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext

from jobqueue.models import Job

register = template.Library()

_PK_MARK = 987654321


def _short(value: datetime | None) -> str:
    """`value|date:"SHORT_DATETIME_FORMAT"|default:"—"` (in the reader's time zone)."""
    if value is None:
        return "—"
    return formats.date_format(timezone.localtime(value), "SHORT_DATETIME_FORMAT")


def _day(value: datetime) -> str:
    return timezone.localtime(value).strftime("%Y%m%d")


def estimated_start_text(job: Job, today: str | None = None) -> str:
    """When a waiting job is likely to start, as HTML: a range where the estimate is far
    enough ahead to be uncertain (today's times only, when both ends are today), else the
    time, else why there is none yet."""
    span = job.estimated_start_range
    if span:
        today = today or _day(timezone.now())
        title = gettext(
            "Estimate: %(when)s. Starts move as running jobs end earlier or later than "
            "predicted and other jobs arrive."
        ) % {"when": _short(job.estimated_start)}
        if _day(span[0]) == today and _day(span[1]) == today:
            text = gettext("likely today between %(earliest)s and %(latest)s") % {
                "earliest": formats.time_format(timezone.localtime(span[0]), "TIME_FORMAT"),
                "latest": formats.time_format(timezone.localtime(span[1]), "TIME_FORMAT"),
            }
        else:
            text = gettext("likely between %(earliest)s and %(latest)s") % {
                "earliest": _short(span[0]),
                "latest": _short(span[1]),
            }
        return (
            f'<span data-testid="estimated-start-range" title="{escape(title)}">'
            f"{escape(text)}</span>"
        )
    if job.estimated_start:
        return escape(_short(job.estimated_start))
    if job.is_awaiting_first_pass:
        return escape(gettext("being scheduled"))
    return escape(gettext("unknown"))


@register.simple_tag
def estimated_start(job: Job) -> SafeString:
    """``{% estimated_start job %}``: the job page's and the queue's estimated start."""
    return mark_safe(estimated_start_text(job))  # noqa: S308 - built from escaped parts


class _Row:
    """What every row of a page shares: the reader, the job link, the cells' labels."""

    def __init__(self, reader: Any) -> None:
        self.reader_id = getattr(reader, "pk", None)
        self.staff = bool(getattr(reader, "is_staff", False))
        self.link_parts = reverse("job_detail", args=[_PK_MARK]).split(str(_PK_MARK))
        # Literal msgids, one per label: `make messages` finds them here.
        self.label = {
            key: escape(text)
            for key, text in (
                ("position", gettext("Position")),
                ("job", gettext("Job")),
                ("owner", gettext("Owner")),
                ("queue", gettext("Queue")),
                ("gpus", gettext("GPUs")),
                ("estimated_start", gettext("Estimated start")),
                ("why", gettext("Why it waits")),
                ("state", gettext("State")),
                ("started", gettext("Started")),
                ("ends", gettext("Time limit ends")),
            )
        }

    def cell(self, key: str, html: str) -> str:
        return f'<td data-label="{self.label[key]}">{html}</td>'

    def opening(self, job: Job) -> str:
        mine = ' class="mine"' if job.owner_id == self.reader_id else ""
        return f'<tr data-job="{job.pk}"{mine}>'

    def job_link(self, job: Job) -> str:
        if job.owner_id == self.reader_id or self.staff:
            return f'<a href="{self.link_parts[0]}{job.pk}{self.link_parts[1]}">{job.pk}</a>'
        return str(job.pk)


@register.simple_tag
def waiting_rows(jobs: Iterable[Job], reader: Any) -> SafeString:
    """The waiting table's rows: position, job, owner, queue, GPUs, estimated start, why."""
    row = _Row(reader)
    slot = escape(gettext("slot"))
    today = _day(timezone.now())
    lines = []
    for job in jobs:
        position = getattr(job, "queue_position", None) or "…"
        gpus = slot if job.shared_slot else str(job.gpus)
        lines.append(
            row.opening(job)
            + row.cell("position", escape(position))
            + row.cell("job", row.job_link(job))
            + row.cell("owner", escape(job.owner.username))
            + row.cell("queue", escape(job.queue.name))
            + row.cell("gpus", gpus)
            + row.cell("estimated_start", estimated_start_text(job, today))
            + row.cell("why", escape(job.pending_reason_text_for(row.reader_id)))
            + "</tr>"
        )
    return mark_safe("\n".join(lines))  # noqa: S308 - built from escaped parts


@register.simple_tag
def running_rows(jobs: Iterable[Job], reader: Any) -> SafeString:
    """The running table's rows: job, owner, queue, its GPUs, state, started, limit ends."""
    row = _Row(reader)
    states: dict[str, str] = {}
    lines = []
    for job in jobs:
        if job.state not in states:
            states[job.state] = (
                f'<span class="state state-{escape(job.state)}">'
                f"{escape(job.get_state_display())}</span>"
            )
        gpus = ", ".join(escape(a.gpu.label) for a in job.allocations.all())
        lines.append(
            row.opening(job)
            + row.cell("job", row.job_link(job))
            + row.cell("owner", escape(job.owner.username))
            + row.cell("queue", escape(job.queue.name))
            + row.cell("gpus", gpus)
            + row.cell("state", states[job.state])
            + row.cell("started", escape(_short(job.started_at)))
            + row.cell("ends", escape(_short(job.expected_end)))
            + "</tr>"
        )
    return mark_safe("\n".join(lines))  # noqa: S308 - built from escaped parts

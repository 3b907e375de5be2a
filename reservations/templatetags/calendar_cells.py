"""The calendar's bookable cells, built in Python: a day's columns, or a week's days, per GPU row.

Rendering ~11,000 cells through the template language took seconds per request
(a URL reverse, three date filters and a translation per cell). This tag
writes the same markup from strings computed once per column.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django import template
from django.urls import reverse
from django.utils import formats, timezone
from django.utils.dateformat import format as date_format
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext

register = template.Library()

_ISO_MINUTE = r"Y-m-d\TH:i"


@dataclass(frozen=True)
class _CellText:
    start: str
    end: str
    when: str
    classes: str
    future: bool
    col: int  # the first column the cell covers
    span: int  # how many columns it covers


def _cell_texts(
    columns: list[Any], now: datetime, *, by_day: bool, max_length: timedelta | None
) -> list[_CellText]:
    """One cell per column; in the week view one per day: a week of hours on 64 GPUs was
    11,000 links and 2.3 MB of HTML. A day's cell offers the day from its first future
    hour (at most ``max_length``); the form, or a drag over several cells, refines it."""
    groups: list[list[int]] = []
    for index, c in enumerate(columns):
        if not groups or not by_day or c.starts_day:
            groups.append([])
        groups[-1].append(index)
    texts = []
    for group in groups:
        first, last = columns[group[0]], columns[group[-1]]
        future = [columns[i] for i in group if columns[i].end > now]
        begin = future[0].start if future else first.start
        finish = last.end
        if by_day and max_length is not None:
            finish = min(finish, begin + max_length)
        start, end = timezone.localtime(begin), timezone.localtime(finish)
        day = " day-start" if first.starts_day else ""
        level = sum(columns[i].busy_level for i in group) // len(group)  # the day's usual load
        texts.append(
            _CellText(
                start=date_format(start, _ISO_MINUTE),
                end=date_format(end, _ISO_MINUTE),
                when=formats.date_format(
                    start, "SHORT_DATE_FORMAT" if by_day else "SHORT_DATETIME_FORMAT"
                ),
                classes=f"busy-{level}{day}",
                future=bool(future),
                col=group[0],
                span=len(group),
            )
        )
    return texts


@register.simple_tag(takes_context=True)
def calendar_cells(
    context: template.Context, row: Any, columns: list[Any], now: datetime, by_day: bool = False
) -> SafeString:
    """One GPU row's cells: a booking link per future cell if the GPU is bookable, else a blank."""
    cache: dict[str, Any] = context.render_context.setdefault("calendar_cells", {})  # type: ignore[arg-type, assignment]
    cells = cache.get("cells")
    if cells is None:
        rules = context.get("rules")
        texts = _cell_texts(
            columns, now, by_day=by_day, max_length=getattr(rules, "max_length", None)
        )
        cells = cache["cells"] = _cell_markup(texts)
        # Escaping the label before it is filled in is the same as escaping it after: its
        # placeholders hold no character that escape() changes, and what fills them is
        # escaped once, here (a column's time) or once per row (the GPU's label).
        cache["book_label"] = escape(gettext("Book %(gpu)s at %(when)s"))
    book_label = cache["book_label"]
    gpu_pk, label = row.gpu.pk, escape(row.gpu.label)
    parts = []
    for link_head, link_tail, when, blank in cells:
        if row.bookable and link_head:
            aria = book_label % {"gpu": label, "when": when}
            parts.append(f'{link_head}{gpu_pk}{link_tail}{aria}"></a>')
        else:
            parts.append(blank)
    return mark_safe("".join(parts))


def _cell_markup(texts: list[_CellText]) -> list[tuple[str, str, str, str]]:
    """Each cell's markup around what differs by row: (the link up to its GPU, the link
    from its GPU to its label, the escaped time its label names, the blank cell). A past
    cell has no link: ("", "", "", the blank). The cell's start and end are in its link
    only (calendar.js reads them there): on a day of 64 GPUs, data attributes repeating
    them were a quarter of the page."""
    book_url = reverse("reservation_book")
    cells = []
    for t in texts:
        span = f' style="grid-column:span {t.span}"' if t.span > 1 else ""
        blank = f'<span class="cal-cell past {t.classes.split(" ")[0]}"{span}></span>'
        if not t.future:
            cells.append(("", "", "", blank))
            continue
        cells.append(
            (
                f'<a class="cal-cell {t.classes}" href="{book_url}?gpus=',
                f'&amp;start={t.start}&amp;end={t.end}" data-col="{t.col}"{span} aria-label="',
                escape(t.when),
                blank,
            )
        )
    return cells


@register.simple_tag
def calendar_head(columns: list[Any], week: bool) -> SafeString:
    """The header's columns (168 in a week): the hour or day, and the usual busy share."""
    usually = gettext("usually %(pct)s%% busy")
    parts = []
    for c in columns:
        start = timezone.localtime(c.start)
        if week:
            text = date_format(start, "D j") if c.starts_day else ("12" if start.hour == 12 else "")
        else:
            text = date_format(start, "H") if c.starts_hour else ""
        day = " day-start" if c.starts_day else ""
        title = escape(usually % {"pct": c.busy_pct})
        parts.append(
            f'<div class="cal-col busy-{c.busy_level}{day}" title="{title}">{escape(text)}</div>'
        )
    return mark_safe("".join(parts))


@register.simple_tag(takes_context=True)
def calendar_bars(context: template.Context, row: Any) -> SafeString:
    """A GPU row's bookings and running jobs, as bars placed in percent of the row."""
    cache: dict[str, Any] = context.render_context.setdefault("calendar_bars", {})  # type: ignore[arg-type, assignment]
    words = cache.get("words")
    if words is None:  # translated once per page, not once per bar
        words = cache["words"] = {
            "job": gettext("job %(job)s runs at most until here"),
            "maintenance": gettext("maintenance"),
            "mine": gettext("your booking"),
            "yours": gettext("yours"),
            "other": gettext("booked by %(who)s"),
        }
    parts = []
    for bar in row.bars:
        reservation = bar.reservation
        note = escape(reservation.note) if reservation is not None and reservation.note else ""
        text: str  # escaped here; `title` is escaped once, when written
        if bar.kind == "job":
            title = words["job"] % {"job": bar.title}
            text = escape(bar.title)
        elif bar.kind == "maintenance":
            title = words["maintenance"] + (f": {reservation.note}" if note else "")
            text = escape(words["maintenance"])
        elif bar.kind == "mine":
            title = words["mine"] + (f": {reservation.note}" if note else "")
            text = escape(words["yours"])
        else:
            title = words["other"] % {"who": bar.title}
            title += f": {reservation.note}" if note else ""
            text = escape(bar.title) + (f" · {note}" if note else "")
        if reservation is not None:
            start = timezone.localtime(reservation.start).strftime("%H:%M")  # "H:i"
            end = timezone.localtime(reservation.end).strftime("%H:%M")
            title += f" · {start}–{end}"
            data = f' data-reservation="{reservation.pk}"'
        else:
            data = ""
        parts.append(
            f'<div class="cal-bar bar-{escape(bar.kind)}" style="left:{bar.left_pct}%;'
            f'width:{bar.width_pct}%"{data} title="{escape(title)}">{text}</div>'
        )
    return mark_safe("".join(parts))

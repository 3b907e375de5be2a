"""The calendar's bookable cells, built in Python: a day's columns, or a week's days, per GPU row.

Rendering ~11,000 cells through the template language took seconds per request
(a URL reverse, three date filters and a translation per cell). This tag
writes the same markup from strings computed once per column.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django import template
from django.urls import reverse
from django.utils import formats, timezone
from django.utils.dateformat import format as date_format
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext

register = template.Library()

_ISO_MINUTE = "%Y-%m-%dT%H:%M"  # the booking form's datetime-local value


def escape(text: Any) -> str:
    """django.utils.html.escape's result without its lazy-string wrapper, which was a
    tenth of the calendar's CPU: the same five characters, escaped the same way."""
    return html.escape(str(text))


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
    zone = timezone.get_current_timezone()
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
        start, end = begin.astimezone(zone), finish.astimezone(zone)
        day = " day-start" if first.starts_day else ""
        level = sum(columns[i].busy_level for i in group) // len(group)  # the day's usual load
        texts.append(
            _CellText(
                start=start.strftime(_ISO_MINUTE),
                end=end.strftime(_ISO_MINUTE),
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
def calendar_rows(context: template.Context) -> SafeString:
    """Every node's heading and GPU rows (cells, bars and the now line): on a day of 64
    GPUs the template language's loop over them was a third of the page's CPU."""
    groups, columns, now = context["groups"], context["columns"], context["now"]
    week, now_pct = bool(context.get("week")), context.get("now_pct")
    if not groups:
        return mark_safe(
            f"<p>{escape(gettext('No GPUs yet: the calendar fills in when a node registers.'))}</p>"
        )
    not_bookable = f' <span class="badge">{escape(gettext("not bookable"))}</span>'
    now_line = (
        f'<div class="cal-now" style="left:{now_pct}%" title="{escape(gettext("now"))}"></div>'
        if now_pct is not None
        else ""
    )
    parts = []
    for group in groups:
        node = group.node
        parts.append(
            f'<div class="cal-node">{escape(node.name)} <span class="state state-'
            f'{escape(node.state)}">{escape(node.get_state_display())}</span></div>'
        )
        for row in group.rows:
            gpu = row.gpu
            parts.append(
                f'<div class="cal-row" data-gpu="{gpu.pk}" data-node="{node.pk}" '
                f'data-testid="gpu-row-{escape(gpu.label)}"><div class="cal-label" '
                f'title="{escape(gpu.model)}">gpu{gpu.index}'
                f'{"" if row.bookable else not_bookable}</div><div class="cal-track">'
                f"{calendar_cells(context, row, columns, now, week)}"
                f"{calendar_bars(context, row)}{now_line}</div></div>"
            )
    return mark_safe("".join(parts))


def calendar_cells(
    context: template.Context, row: Any, columns: list[Any], now: datetime, by_day: bool = False
) -> SafeString:
    """One GPU row's cells: a booking link per future cell if the GPU is bookable, else a blank.

    The row's markup is written once per page with markers where the GPU's id and label
    go; each row replaces them (two C-speed passes, not a format per cell: a day of 96
    columns on 64 GPUs is 6,144 links)."""
    cache: dict[str, Any] = context.render_context.setdefault("calendar_cells", {})  # type: ignore[arg-type, assignment]
    rows = cache.get("rows")
    if rows is None:
        rules = context.get("rules")
        texts = _cell_texts(
            columns, now, by_day=by_day, max_length=getattr(rules, "max_length", None)
        )
        rows = cache["rows"] = _row_markup(_cell_markup(texts))
    bookable, blank = rows
    if not row.bookable:
        return blank
    return mark_safe(
        bookable.replace(_GPU_MARK, str(row.gpu.pk)).replace(_LABEL_MARK, escape(row.gpu.label))
    )


# Where a row's GPU id and (escaped) label go: characters no URL, label or escape() holds.
_GPU_MARK, _LABEL_MARK = "\x00gpu\x00", "\x00label\x00"


def _row_markup(cells: list[tuple[str, str, str, str]]) -> tuple[str, SafeString]:
    """A bookable row's markup with the GPU's markers, and a row of blanks."""
    # Escaping the label before it is filled in is the same as escaping it after: its
    # placeholders hold no character that escape() changes, and what fills them is
    # escaped once, here (a column's time) or once per row (the GPU's label).
    book_label = escape(gettext("Book %(gpu)s at %(when)s"))
    bookable = []
    for link_head, link_tail, when, blank in cells:
        if link_head:
            aria = book_label % {"gpu": _LABEL_MARK, "when": when}
            bookable.append(f'{link_head}{_GPU_MARK}{link_tail}{aria}"></a>')
        else:
            bookable.append(blank)
    return "".join(bookable), mark_safe("".join(blank for *_, blank in cells))


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
    zone, parts = timezone.get_current_timezone(), []
    for c in columns:
        start = c.start.astimezone(zone)
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
    zone, parts = timezone.get_current_timezone(), []
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
            start = reservation.start.astimezone(zone).strftime("%H:%M")  # "H:i"
            end = reservation.end.astimezone(zone).strftime("%H:%M")
            title += f" · {start}–{end}"
            data = f' data-reservation="{reservation.pk}"'
        else:
            data = ""
        parts.append(
            f'<div class="cal-bar bar-{escape(bar.kind)}" style="left:{bar.left_pct}%;'
            f'width:{bar.width_pct}%"{data} title="{escape(title)}">{text}</div>'
        )
    return mark_safe("".join(parts))

"""The calendar's bookable cells, built in Python: a week has 168 of them on every GPU row.

Rendering ~11,000 cells through the template language took seconds per request
(a URL reverse, three date filters and a translation per cell). This tag
writes the same markup from strings computed once per column.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
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
class _ColumnText:
    start: str
    end: str
    when: str
    classes: str
    future: bool


def _column_texts(columns: list[Any], now: datetime) -> list[_ColumnText]:
    texts = []
    for c in columns:
        start, end = timezone.localtime(c.start), timezone.localtime(c.end)
        day = " day-start" if c.starts_day else ""
        texts.append(
            _ColumnText(
                start=date_format(start, _ISO_MINUTE),
                end=date_format(end, _ISO_MINUTE),
                when=formats.date_format(start, "SHORT_DATETIME_FORMAT"),
                classes=f"busy-{c.busy_level}{day}",
                future=c.end > now,
            )
        )
    return texts


@register.simple_tag(takes_context=True)
def calendar_cells(
    context: template.Context, row: Any, columns: list[Any], now: datetime
) -> SafeString:
    """One GPU row's cells: a booking link per future column if the GPU is bookable, else a blank."""
    cache = context.render_context.setdefault("calendar_cells", {})
    texts = cache.get("columns")
    if texts is None:
        texts = cache["columns"] = _column_texts(columns, now)
        cache["book_url"] = reverse("reservation_book")
        cache["book_label"] = gettext("Book %(gpu)s at %(when)s")
    book_url, book_label = cache["book_url"], cache["book_label"]
    gpu_pk, label = row.gpu.pk, row.gpu.label
    parts = []
    for index, t in enumerate(texts):
        if row.bookable and t.future:
            aria = escape(book_label % {"gpu": label, "when": t.when})
            parts.append(
                f'<a class="cal-cell {t.classes}" href="{book_url}?gpus={gpu_pk}&amp;start={t.start}'
                f'&amp;end={t.end}" data-start="{t.start}" data-end="{t.end}" data-col="{index}"'
                f' aria-label="{aria}"></a>'
            )
        else:
            parts.append(f'<span class="cal-cell past {t.classes.split(" ")[0]}"></span>')
    return mark_safe("".join(parts))  # noqa: S308 - every value above is escaped or ours

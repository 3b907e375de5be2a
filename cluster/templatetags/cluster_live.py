from __future__ import annotations

from datetime import timedelta

from django import template
from django.utils.translation import gettext as _

register = template.Library()


@register.filter
def age(value: timedelta | None) -> str:
    """A short "how long ago" for live data: 4 s, 3 min, 2 h, 5 d; "never" when there is none."""
    if value is None:
        return _("never")
    seconds = max(0, int(value.total_seconds()))
    if seconds < 120:
        return _("%(n)d s ago") % {"n": seconds}
    if seconds < 2 * 3600:
        return _("%(n)d min ago") % {"n": seconds // 60}
    if seconds < 2 * 86400:
        return _("%(n)d h ago") % {"n": seconds // 3600}
    return _("%(n)d d ago") % {"n": seconds // 86400}

"""{% backup_status %}: for staff, the newest backup and whether it is overdue (a builtin)."""

from __future__ import annotations

from django import template

register = template.Library()


@register.inclusion_tag("ops/_backup_status.html", takes_context=True)
def backup_status(context: template.Context, banner: bool = False) -> dict[str, object]:
    """For staff: the newest backup, and whether it is overdue (only where backups are on)."""
    from django.conf import settings

    from ops.backups import backup_is_stale, last_backup

    user = context.get("user")
    if user is None or not user.is_staff:
        return {"show": False}
    stale = settings.LABPORTAL_BACKUP_ENABLED and backup_is_stale()
    return {"show": stale or not banner, "banner": banner, "stale": stale, "last": last_backup()}

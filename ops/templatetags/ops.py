"""Builtins: {% backup_status %} for staff (the newest backup and whether it is overdue),
{% slurm_status %} for everyone signed in (in Slurm mode, since when Slurm has been
unreachable; for staff, how many changes Slurm refused the portal) and {% grafana_url %} (a deep link into the lab's Grafana dashboards)."""

from __future__ import annotations

from urllib.parse import urlencode

from django import template
from django.conf import settings

register = template.Library()


@register.inclusion_tag("ops/_backup_status.html", takes_context=True)
def backup_status(context: template.Context, banner: bool = False) -> dict[str, object]:
    """For staff: the newest backup, and whether it is overdue (only where backups are on)."""
    from ops.backups import backup_is_stale, last_backup

    user = context.get("user")
    if user is None or not user.is_staff:
        return {"show": False}
    stale = settings.LABPORTAL_BACKUP_ENABLED and backup_is_stale()
    return {"show": stale or not banner, "banner": banner, "stale": stale, "last": last_backup()}


@register.inclusion_tag("ops/_slurm_status.html", takes_context=True)
def slurm_status(context: template.Context) -> dict[str, object]:
    """In Slurm mode, while Slurm cannot be reached: since when (job states shown are as
    Slurm last reported them). Nothing otherwise; it recovers when Slurm answers again."""
    from slurm.cli import slurm_unreachable_since

    user = context.get("user")
    if settings.LABPORTAL_EXECUTOR != "slurm" or user is None or not user.is_authenticated:
        return {"since": None, "problems": 0}
    problems = 0
    if user.is_staff:
        from slurm.setup_check import open_problem_count

        problems = open_problem_count()
    return {"since": slurm_unreachable_since(), "problems": problems}


# The dashboards provisioned from deploy/monitoring/grafana/dashboards/ (their uids).
GRAFANA_DASHBOARDS = {
    "overview": "labportal-overview",
    "node": "labportal-node",
    "gpu": "labportal-gpu",
    "user": "labportal-user",
}


@register.simple_tag
def grafana_url(dashboard: str = "overview", **variables: str) -> str:
    """The dashboard's address in the lab's Grafana with its variables set
    (``{% grafana_url "gpu" node=node.name uuid=gpu.uuid %}``); "" where no
    LABPORTAL_GRAFANA_URL is set."""
    base = settings.LABPORTAL_GRAFANA_URL
    if not base:
        return ""
    query = urlencode({f"var-{name}": value for name, value in variables.items()})
    return f"{base}/d/{GRAFANA_DASHBOARDS[dashboard]}/" + (f"?{query}" if query else "")

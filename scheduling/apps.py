from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class SchedulingConfig(AppConfig):
    name = "scheduling"
    verbose_name = _("scheduling (LabPortal's agents)")

    def ready(self) -> None:
        # Connects the receivers of cluster's node_reported_jobs and node_jobs_lost.
        from scheduling import agent_events  # noqa: F401

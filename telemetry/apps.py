from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class TelemetryConfig(AppConfig):
    name = "telemetry"
    verbose_name = _("Telemetry")

    def ready(self) -> None:
        from core.metrics import register_collector
        from jobqueue.signals import scheduling_pass_done
        from telemetry.metrics import PortalCollector, scheduling_pass_observed

        register_collector(PortalCollector())
        # The duration of each scheduling pass, in the stored histogram /metrics shows.
        scheduling_pass_done.connect(scheduling_pass_observed, dispatch_uid="telemetry-pass")

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class TelemetryConfig(AppConfig):
    name = "telemetry"
    verbose_name = _("Telemetry")

    def ready(self) -> None:
        from core.metrics import register_collector
        from telemetry.metrics import PortalCollector

        register_collector(PortalCollector())

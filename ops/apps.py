from django.apps import AppConfig


class OpsConfig(AppConfig):
    """Running the portal: backups, the /metrics exposition, /healthz."""

    name = "ops"

    def ready(self) -> None:
        from core.metrics import register_collector
        from ops.backups import BackupCollector

        register_collector(BackupCollector())

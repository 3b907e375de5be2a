from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class SlurmConfig(AppConfig):
    name = "slurm"
    verbose_name = _("Slurm mode")

    def ready(self) -> None:
        from slurm import directory, extensions, rules_signals

        rules_signals.connect()
        directory.connect()
        extensions.register()

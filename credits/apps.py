from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class CreditsConfig(AppConfig):
    name = "credits"
    verbose_name = _("credits for jobs")

    def ready(self) -> None:
        from credits import receivers  # noqa: F401  (connects the job_ended receiver)

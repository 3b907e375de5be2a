from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class JobLogsConfig(AppConfig):
    name = "joblogs"
    verbose_name = _("Job logs")

    def ready(self) -> None:
        from joblogs.selectors import job_page_log
        from jobqueue.extensions import register_job_page_context

        register_job_page_context("joblogs", job_page_log)

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class AlertsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "alerts"
    verbose_name = _("Alerts")

    def ready(self) -> None:
        from alerts.selectors import alerts_for_job
        from jobqueue.extensions import register_job_page_context

        register_job_page_context(
            "alerts", lambda job: {"job_alerts": alerts_for_job(job_id=job.pk)}
        )

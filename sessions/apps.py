from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class SessionsConfig(AppConfig):
    name = "sessions"
    # "sessions" is django.contrib.sessions' label.
    label = "lab_sessions"
    verbose_name = _("Interactive sessions")

    def ready(self) -> None:
        from jobqueue.extensions import register_job_page_context
        from sessions.selectors import job_page_links

        register_job_page_context("sessions", job_page_links)

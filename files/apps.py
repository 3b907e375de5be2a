from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class FilesConfig(AppConfig):
    name = "files"
    verbose_name = _("Files")

    def ready(self) -> None:
        from jobqueue.extensions import register_job_page_context

        # The job page links to the job's folder ("Job files").
        register_job_page_context("files", lambda job: {"job_files_ref": f"job:{job.pk}"})

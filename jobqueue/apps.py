from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class JobqueueConfig(AppConfig):
    name = "jobqueue"
    verbose_name = _("Jobs and queues")

"""The one Celery app of the portal (control worker and beat)."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import task_prerun

from core.log_context import task_context_from
from core.portal_app import set_portal_app
from protocol.broker import install as install_broker_transports

# Malformed messages are dropped, not raised, and the demo's serverless broker writes
# message files atomically (see protocol/broker.py).
install_broker_transports()

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "labportal.settings")

app = Celery("labportal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
set_portal_app(app)  # for the apps, which may not import labportal/


def node_queue(node_name: str) -> str:
    """The queue a node agent consumes: node.<name>."""
    return f"node.{node_name}"


@task_prerun.connect
def _log_context_of_task(
    task_id: str | None = None, kwargs: dict[str, Any] | None = None, **_: Any
) -> None:
    """Each log record of a task carries its id and the job it is about (LOG_FORMAT=json)."""
    task_context_from(task_id_value=task_id, kwargs=kwargs)

"""The one Celery app of the portal (control worker and beat)."""

from __future__ import annotations

import os

from celery import Celery

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

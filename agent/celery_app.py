"""The agent's own Celery app: no Django, no result backend, JSON only.

The broker URL is set at start-up by ``agent.main`` (``--broker`` or
``LABPORTAL_BROKER_URL``); importing this module connects to nothing.
"""

from __future__ import annotations

import os

from celery import Celery

from protocol.broker import CONSUMER
from protocol.broker import install as install_broker_transports

install_broker_transports()

CONTROL_QUEUE = "control"


def node_queue(node_name: str) -> str:
    """The only queue a node's agent consumes."""
    return f"node.{node_name}"


def create_app(broker_url: str | None = None) -> Celery:
    """A Celery app with the agent's settings; the module-level ``app`` is the one in use."""
    if broker_url:
        _drop_environment_broker()
    new_app = Celery("labportal_agent", broker=broker_url, include=["agent.tasks"])
    new_app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        result_backend=None,
        task_ignore_result=True,
        # Nothing the agent sends should land in Celery's default "celery" queue.
        task_default_queue=CONTROL_QUEUE,
        # Redelivery is safe (every task is idempotent); losing a start is not.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        # A message it cannot take is dropped and reported, never raised (protocol.broker).
        worker_consumer=CONSUMER,
        broker_connection_retry_on_startup=True,
        # Redis re-delivers unacked messages after this long: keep it well
        # above the longest task (a stop with a long grace period).
        broker_transport_options={"visibility_timeout": 3600},
    )
    return new_app


app = create_app()


def configure(broker_url: str) -> Celery:
    """Point the app at ``broker_url`` and return it; later messages go there only."""
    _drop_environment_broker()
    app.conf.broker_url = broker_url
    # Pools made before (for another broker) would keep sending there; Celery resets
    # the same two attributes after a fork.
    if app._pool is not None:
        app._pool.force_close_all()
    app._pool = None
    app.amqp._producer_pool = None
    return app


def _drop_environment_broker() -> None:
    # Celery prefers CELERY_BROKER_URL from the environment over the broker it is
    # given; the agent's broker is --broker / LABPORTAL_BROKER_URL and nothing else.
    os.environ.pop("CELERY_BROKER_URL", None)

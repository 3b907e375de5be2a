"""The configured broker (filesystem in the demo, Redis in production) carries messages."""

from __future__ import annotations

import uuid

from django.conf import settings
from kombu import Connection, Exchange, Queue

from labportal.celery import app, node_queue


def test_the_configured_broker_delivers_a_message() -> None:
    name = f"labportal-test-{uuid.uuid4().hex[:8]}"
    queue = Queue(name, Exchange(name, type="direct"), routing_key=name)
    with Connection(
        settings.CELERY_BROKER_URL, transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS
    ) as conn:
        with conn.Producer() as producer:
            producer.publish(
                {"hello": "node"}, exchange=queue.exchange, routing_key=name, declare=[queue]
            )
        simple = conn.SimpleQueue(queue)
        message = simple.get(timeout=10)
        assert message.payload == {"hello": "node"}
        message.ack()
        simple.close()


def test_control_tasks_route_to_the_control_queue_and_nodes_have_their_own() -> None:
    route = app.amqp.router.route({}, "control.node_heartbeat", args=(), kwargs={})
    assert route["queue"].name == "control"
    assert node_queue("gpu01") == "node.gpu01"


def test_every_beat_entry_names_a_registered_control_task() -> None:
    app.loader.import_default_modules()
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        task = entry["task"]
        assert isinstance(task, str), name
        assert task in app.tasks, name
        assert task.startswith("control."), name

"""A task that finishes just as the broker connection is lost must not stop the worker.

The control worker exited ("Unrecoverable error: AttributeError: 'NoneType' object has no
attribute 'hostname'") when Redis went away while a task was running: Celery closed the
lost connection, and the task's ack that followed failed inside kombu with an
AttributeError, which Celery does not take as a connection error. Through LabPortal's Redis
transport (protocol.broker) it is the connection error it is: Celery logs it, reconnects,
and the unacked message comes back.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kombu import Connection, Exchange, Queue
from kombu.common import ignore_errors

from protocol.broker import RedisChannel, RedisTransport, install
from tests.reliability.private_services import PrivateRedis

pytestmark = pytest.mark.redis


@pytest.fixture
def redis_server() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_an_ack_or_restore_once_kombu_forgot_the_connection_is_a_connection_error(
    redis_server: PrivateRedis,
) -> None:
    install()
    name = f"t-{uuid.uuid4().hex[:8]}"
    queue = Queue(name, Exchange(name), routing_key=name)
    conn = Connection(redis_server.url)
    assert isinstance(conn.transport, RedisTransport)
    with conn.Producer() as producer:
        producer.publish({"n": 1}, exchange=queue.exchange, routing_key=name, declare=[queue])
    channel = conn.default_channel  # the consumer's channel
    assert isinstance(channel, RedisChannel)
    message = queue(channel).get(no_ack=False)
    assert message is not None and message.payload == {"n": 1}
    errors = conn.connection_errors

    # The state the worker's log showed when it exited: Redis gone, the lost connection
    # released by Celery (kombu sets the transport's client to None) and the channel's
    # pools dropped, while a task still had its message to ack.
    redis_server.stop()
    channel.connection.client = None
    channel._disconnect_pools()

    with pytest.raises(errors):
        message.ack()
    with pytest.raises(errors):
        channel.qos.restore_unacked()
    ignore_errors(conn, channel.close)  # Celery's close of the lost connection passes

    # The message was never acked: with Redis back, it is returned to its queue (by the
    # worker's next restore of unacked messages past their visibility timeout; here at once).
    redis_server.start()
    again = Connection(redis_server.url, transport_options={"visibility_timeout": 0})
    try:
        restored = again.channel()
        restored.qos.restore_visible(num=10)
        back = queue(restored).get(no_ack=True)
        assert back is not None and back.payload == {"n": 1}
    finally:
        again.close()

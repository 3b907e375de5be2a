"""The broker's side of the control worker and the agents: whatever is in a queue, they keep running.

Anyone who can reach the broker can put anything in a queue (the threat model of
``protocol.signing``). kombu and Celery decode what they read in the worker's event
loop, so one message that was not JSON, not a kombu message or not a task message
stopped the control worker or an agent ("Unrecoverable error"), before any
signature was checked, and again after every restart. Here such a message is
dropped, logged and counted in ``rejections``; the process's listener shows it to
the portal's admins, and the worker goes on to the next message. What is left
reaches the tasks, which check the signature.

- The transports (Redis, and the demo's filesystem broker) drop a payload that is
  not JSON or not a kombu message before kombu builds a message from it.
- ``GuardedConsumer`` (Celery's ``worker_consumer``) drops a task message that
  names no task of this process, whose body is not ``[args, kwargs, embed]`` or
  whose arguments do not fit the task, and any other message Celery cannot take.

The filesystem transport also writes message files atomically: kombu writes a
file in place while a consumer may already move and read it, so a consumer could
read an empty file. Here a message is written under a temporary name and renamed
into place, which is atomic on one filesystem.

No Django here: the agent imports this module, and so does the portal.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from time import monotonic
from typing import Any

from celery.worker.consumer import Consumer
from kombu.exceptions import ChannelError, DecodeError
from kombu.transport import TRANSPORT_ALIASES, filesystem, redis
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps
from redis.exceptions import ConnectionError as RedisConnectionError
from vine import promise

log = logging.getLogger(__name__)

# The kinds of dropped messages.
UNDECODABLE = "undecodable"  # not JSON
MALFORMED = "malformed"  # JSON, but not a kombu message or not a task message
UNKNOWN_TASK = "unknown_task"  # a task message naming no task of this process
INVALID_TASK = "invalid_task"  # a known task, with a body or arguments that do not fit it

# Celery's `worker_consumer` setting of both processes.
CONSUMER = "protocol.broker:GuardedConsumer"

# How much of a dropped message the log and the admins see.
SHOWN_CHARS = 200


@dataclass(frozen=True)
class Rejection:
    """One message dropped off ``queue``; ``task`` is set only when it named a task of ours."""

    kind: str
    queue: str
    detail: str
    task: str | None = None


class Rejections:
    """The messages this process dropped, counted by kind; each listener hears of each one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._listeners: list[Callable[[Rejection], object]] = []

    def connect(self, listener: Callable[[Rejection], object]) -> None:
        with self._lock:
            if listener not in self._listeners:
                self._listeners.append(listener)

    def disconnect(self, listener: Callable[[Rejection], object]) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def record(self, rejection: Rejection) -> None:
        """Log and count a dropped message and tell the listeners; never raises."""
        with self._lock:
            self._counts[rejection.kind] += 1
            total = sum(self._counts.values())
            listeners = list(self._listeners)
        log.warning(
            "dropped a message from queue %r (%s%s): %s; %d dropped since this process started",
            rejection.queue,
            rejection.kind,
            f", {rejection.task}" if rejection.task else "",
            rejection.detail,
            total,
        )
        for listener in listeners:
            try:
                listener(rejection)
            except Exception:
                # Recording must not stop the worker either (the database may be down).
                log.exception("could not record the dropped message")


rejections = Rejections()


def shown(value: object) -> str:
    """A bounded, printable excerpt of what a message carried."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}…"


def envelope_problem(raw: object) -> str | None:
    """Why a decoded payload is not a message kombu can build and acknowledge, or None."""
    if not isinstance(raw, dict):
        return f"a JSON {type(raw).__name__}, not a message object"
    properties = raw.get("properties")
    if not isinstance(properties, dict):
        return "the message has no 'properties' object"
    if not isinstance(properties.get("delivery_tag"), str):
        return "the message has no 'delivery_tag' string"
    info = properties.get("delivery_info")
    if not (
        isinstance(info, dict)
        and isinstance(info.get("exchange"), str)
        and isinstance(info.get("routing_key"), str)
    ):
        return "the message has no 'delivery_info' with 'exchange' and 'routing_key'"
    if not isinstance(raw.get("headers") or {}, dict):
        return "the message's 'headers' are not an object"
    for key in ("body", "content-type", "content-encoding"):
        if not isinstance(raw.get(key) or "", str):
            return f"the message's {key!r} is not a string"
    return None


class _DropsUnreadable:
    """Channel mixin: a payload that is not JSON or not a kombu message is dropped, not raised."""

    Message: Any
    qos: Any
    connection: Any

    def _drop_undecodable(self, queue: str, exc: ValueError) -> None:
        text = exc.doc if isinstance(exc, json.JSONDecodeError) else exc
        rejections.record(Rejection(UNDECODABLE, queue, f"not JSON: {shown(text)}"))

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        # The next message that decodes, if any: `Empty` ends the search.
        while True:
            try:
                if timeout is None:
                    return super()._get(queue)  # type: ignore[misc]
                return super()._get(queue, timeout)  # type: ignore[misc]
            except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
                self._drop_undecodable(queue, exc)

    def basic_consume(
        self, queue: str, no_ack: bool, callback: Callable[[Any], Any], consumer_tag: str, **kw: Any
    ) -> None:
        super().basic_consume(queue, no_ack, callback, consumer_tag, **kw)  # type: ignore[misc]

        # kombu's own callback (virtual.Channel.basic_consume), with the payload checked first.
        def deliver(raw: Any) -> Any:
            problem = envelope_problem(raw)
            if problem is None:
                try:
                    message = self.Message(raw, channel=self)
                except Exception as exc:  # a body its own encoding cannot decode, say
                    problem = f"{type(exc).__name__}: {exc}"
            if problem is not None:
                rejections.record(Rejection(MALFORMED, queue, f"{problem}: {shown(raw)}"))
                return None
            if not no_ack:
                self.qos.append(message, message.delivery_tag)
            return callback(message)

        self.connection._callbacks[queue] = deliver


class RedisChannel(_DropsUnreadable, redis.Channel):
    def _brpop_read(self, **options: Any) -> bool:
        # The message is off the list before kombu decodes it, so dropping it loses nothing.
        try:
            return bool(super()._brpop_read(**options))
        except json.JSONDecodeError as exc:
            # kombu has just rotated the list it read to the end of its cycle.
            items = getattr(self._queue_cycle, "items", None) or ["?"]
            self._drop_undecodable(str(items[-1]), exc)
            return True

    def _connparams(self, asynchronous: bool = False) -> Any:
        # After the connection to Redis is lost, Celery closes it, and kombu forgets the
        # connection's parameters; an ack or a restore of unacked messages that comes after
        # (a task finishing at that moment) then failed on them with AttributeError, which
        # Celery takes as unrecoverable: the worker exited. Raised as the connection error it
        # is, Celery logs it and reconnects, and Redis gives the message back (it is unacked).
        if self.connection is None or self.connection.client is None:
            raise RedisConnectionError("the connection to the broker is closed")
        return super()._connparams(asynchronous=asynchronous)


class RedisTransport(redis.Transport):
    Channel = RedisChannel


class FilesystemChannel(_DropsUnreadable, filesystem.Channel):
    # kombu names the message `payload` here and `message` in AbstractChannel, which
    # filesystem.Channel overrides with that name; this keeps the direct parent's.
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # The temporary name never ends in ".<queue>.msg", so no consumer picks it up.
        partial = os.path.join(self.data_folder_out, f".{uuid.uuid4()}.partial")
        try:
            with open(partial, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.rename(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory: {exc}") from exc


class FilesystemTransport(filesystem.Transport):
    Channel = FilesystemChannel


def install() -> None:
    """Route ``redis://``, ``rediss://`` and ``filesystem://`` broker URLs to these transports."""
    TRANSPORT_ALIASES["redis"] = "protocol.broker:RedisTransport"
    TRANSPORT_ALIASES["rediss"] = "protocol.broker:RedisTransport"
    TRANSPORT_ALIASES["filesystem"] = "protocol.broker:FilesystemTransport"


def task_message_problem(message: Any, tasks: Any) -> str | None:
    """Why a message that names a task of ours cannot run it; None to let Celery take it.

    Celery leaves a body that is not ``[args, kwargs, embed]``, or arguments that do
    not fit the task, to fail in the pool or to stop the consumer; here they are
    refused first.
    """
    task = tasks.get(message.headers.get("task"))
    if task is None:
        return None  # Celery refuses it (unknown task, or not a task message)
    try:
        body = message.payload
    except DecodeError:
        return None  # Celery's on_decode_error
    if not (isinstance(body, list) and len(body) == 3):
        return f"the body is {shown(body)}, not [args, kwargs, embed]"
    args, kwargs, embed = body
    if not (isinstance(args, list) and isinstance(kwargs, dict) and isinstance(embed, dict | None)):
        return f"args, kwargs or embed of the wrong type: {shown(body)}"
    fits = getattr(task, "__header__", None)
    if fits is not None:
        try:
            fits(*args, **kwargs)
        except TypeError as exc:
            return f"the arguments do not fit: {exc}"
    return None


class GuardedConsumer(Consumer):
    """Celery's consumer, except that a message it cannot take is dropped and counted, never raised."""

    def create_task_handler(self, promise: Any = promise) -> Callable[[Any], Any]:
        handle = super().create_task_handler(promise)
        tasks = self.app.tasks

        def on_task_received(message: Any) -> Any:
            try:
                problem = task_message_problem(message, tasks)
                if problem is None:
                    return handle(message)
            except self.connection_errors:
                raise  # the broker went away: Celery reconnects
            except Exception as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if not message.acknowledged:
                message.reject_log_error(log, self.connection_errors)
            self._record(message, INVALID_TASK, problem)
            return None

        return on_task_received

    def _record(self, message: Any, kind: str, detail: str) -> None:
        queue = (message.delivery_info or {}).get("routing_key") or "?"
        name = message.headers.get("task")
        # Only the name of a task of ours: any other would be the sender's to choose.
        task = name if isinstance(name, str) and name in self.app.tasks else None
        rejections.record(Rejection(kind, str(queue), detail, task))

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        super().on_unknown_task(body, message, exc)
        self._record(message, UNKNOWN_TASK, f"no task named {shown(message.headers.get('task'))}")

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        super().on_invalid_task(body, message, exc)
        self._record(message, INVALID_TASK, f"{type(exc).__name__}: {exc}")

    def on_unknown_message(self, body: Any, message: Any) -> None:
        super().on_unknown_message(body, message)
        self._record(message, MALFORMED, f"not a task message: {shown(message.headers)}")

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        super().on_decode_error(message, exc)
        self._record(message, MALFORMED, f"the body cannot be decoded: {exc}")

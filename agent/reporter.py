"""Sends the agent's reports to the portal: tasks by name on the ``control`` queue.

Every message's first two arguments are the node name and a signature over the
whole message made with the node token's key (``protocol.signing``); the token
itself never travels on the broker. The portal checks both before it believes
anything else in the message.

Job events that cannot be handed to the broker wait in an outbox, in order, and
are retried with a backoff (``OUTBOX_BACKOFF_MAX_S`` at most) for as long as it
takes. Given a directory (the agent's state dir), the outbox is kept on disk,
one file per event, so a restart of the agent during an outage loses none.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from agent.celery_app import CONTROL_QUEUE
from protocol.signing import HEARTBEAT_TTL_S, REPORT_TTL_S, key_from_token, sign, token_kid

log = logging.getLogger(__name__)

NODE_REGISTER = "control.node_register"
NODE_HEARTBEAT = "control.node_heartbeat"
JOB_EVENT = "control.job_event"
SAMPLES_INGEST = "control.samples_ingest"
JOB_LOGS_REPORT = "control.job_logs_report"
JOB_LOG_CHUNK = "control.job_log_chunk"
COMMAND_REFUSED = "control.command_refused"


class TaskSender(Protocol):
    """The one method of a Celery app the reporter uses (tests pass a recorder)."""

    def send_task(self, name: str, args: Any = None, **options: Any) -> Any: ...


# Retries of the outbox wait 1, 2, 4, ... seconds after a failure, at most this long, so
# that events land soon after the broker is back.
OUTBOX_BACKOFF_MAX_S = 30.0
# Past this many waiting events (days of a busy node's events) the newest is refused,
# loudly: the disk must not fill.
MAX_OUTBOX_EVENTS = 20_000


class Outbox:
    """Job events not yet handed to the broker, oldest first; kept in ``directory`` if given.

    One file per event, named by its place in the line, written whole (renamed into
    place, synced) before it counts as kept, and removed once the broker took it.
    """

    def __init__(self, directory: Path | None, max_events: int = MAX_OUTBOX_EVENTS) -> None:
        self._dir = directory
        self._max = max_events
        self._events: deque[tuple[int, dict[str, Any]]] = deque()
        self._next = 0
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            for path in sorted(directory.glob("*.json")):
                try:
                    self._events.append((int(path.stem), json.loads(path.read_text())))
                except (OSError, ValueError):
                    log.error("outbox: %s cannot be read; left in place", path)
            if self._events:
                self._next = self._events[-1][0] + 1
                log.info("outbox: %d job event(s) from before the restart", len(self._events))

    def __len__(self) -> int:
        return len(self._events)

    def append(self, event: dict[str, Any]) -> bool:
        if len(self._events) >= self._max:
            log.error("outbox full (%d events): job event %s dropped", self._max, event)
            return False
        place, self._next = self._next, self._next + 1
        if self._dir is not None:
            path = self._dir / f"{place:012d}.json"
            tmp = path.with_suffix(".tmp")
            with tmp.open("w") as out:
                json.dump(event, out)
                out.flush()
                os.fsync(out.fileno())
            tmp.replace(path)
        self._events.append((place, event))
        return True

    def first(self) -> dict[str, Any] | None:
        return self._events[0][1] if self._events else None

    def pop_first(self) -> None:
        place, _event = self._events.popleft()
        if self._dir is not None:
            with contextlib.suppress(FileNotFoundError):
                (self._dir / f"{place:012d}.json").unlink()


class ControlReporter:
    """Sends reports; keeps job events that could not be sent and retries them.

    Job events matter (they move jobs through their lifecycle), so a broker
    outage must not lose them: they wait in the outbox (on disk, given
    ``outbox_dir``) that ``flush_outbox`` retries, in order, backing off after each
    failure. Samples and heartbeats are dropped instead, since the next ones
    supersede them.
    """

    def __init__(
        self,
        app: TaskSender,
        node: str,
        token: str,
        *,
        outbox_dir: Path | None = None,
        max_outbox: int = MAX_OUTBOX_EVENTS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._app = app
        self._node = node
        self._key = key_from_token(token)
        self._kid = token_kid(token)
        self._lock = threading.Lock()
        self._outbox = Outbox(outbox_dir, max_outbox)
        self._clock = clock
        self._failures = 0
        self._next_try = 0.0

    def _send(self, name: str, *args: Any, ttl_s: float = REPORT_TTL_S) -> None:
        # Signed at each try, so an event that waited in the outbox leaves fresh.
        auth = sign(
            self._key,
            kid=self._kid,
            task=name,
            node=self._node,
            args=list(args),
            ttl_s=ttl_s,
        )
        self._app.send_task(name, args=[self._node, auth, *args], queue=CONTROL_QUEUE)

    def register(self, info: dict[str, Any]) -> None:
        """Send ``control.node_register``; raise if the broker is unreachable."""
        self._send(NODE_REGISTER, info)

    def heartbeat(self, info: dict[str, Any]) -> bool:
        # Short-lived: a heartbeat that waited is no news of the node now.
        return self._try(NODE_HEARTBEAT, info, ttl_s=HEARTBEAT_TTL_S)

    def samples(self, samples: list[dict[str, Any]]) -> bool:
        return self._try(SAMPLES_INGEST, samples)

    def job_logs(self, job_id: int, text: str) -> bool:
        return self._try(JOB_LOGS_REPORT, job_id, text)

    def job_log_chunk(self, chunk: dict[str, Any]) -> bool:
        """One piece of a job's output (``agent.logstream``); its sender retries a failure."""
        return self._try(JOB_LOG_CHUNK, chunk)

    def refusal(self, task: str, reason: str, detail: str) -> bool:
        """Tell the portal's admins that this agent refused a command (forged, replayed, ...)."""
        return self._try(COMMAND_REFUSED, task, reason, detail)

    def job_event(self, event: dict[str, Any]) -> bool:
        """Send an event now, or keep it for ``flush_outbox``. True if it went out now."""
        with self._lock:
            # Keep order: nothing overtakes events already waiting.
            if self._outbox:
                self._outbox.append(event)
                return False
        if self._try(JOB_EVENT, event):
            return True
        with self._lock:
            self._outbox.append(event)
            self._failed()
        return False

    def flush_outbox(self, *, now_or_never: bool = False) -> int:
        """Retry waiting events in order, unless backing off; stop at the first failure.

        ``now_or_never`` ignores the backoff (another report just went out, so the broker
        is back). Returns how many events still wait.
        """
        with self._lock:
            if self._outbox and not now_or_never and self._clock() < self._next_try:
                return len(self._outbox)
        while True:
            with self._lock:
                event = self._outbox.first()
                if event is None:
                    self._failures = 0
                    return 0
            if not self._try(JOB_EVENT, event):
                with self._lock:
                    self._failed()
                    return len(self._outbox)
            with self._lock:
                if self._outbox.first() is event:
                    self._outbox.pop_first()

    def _failed(self) -> None:
        """Back off: the next flush waits 1, 2, 4, ... s, at most OUTBOX_BACKOFF_MAX_S."""
        delay = min(OUTBOX_BACKOFF_MAX_S, 2.0 ** min(self._failures, 10))
        self._failures += 1
        self._next_try = self._clock() + delay

    @property
    def pending_events(self) -> int:
        with self._lock:
            return len(self._outbox)

    def _try(self, name: str, *args: Any, ttl_s: float = REPORT_TTL_S) -> bool:
        try:
            self._send(name, *args, ttl_s=ttl_s)
        except Exception as exc:  # kombu raises many kinds; all mean "not sent"
            log.warning("could not send %s: %s", name, exc)
            return False
        return True

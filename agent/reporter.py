"""Sends the agent's reports to the portal: tasks by name on the ``control`` queue.

Every message's first two arguments are the node name and a signature over the
whole message made with the node token's key (``agent.signing``); the token
itself never travels on the broker. The portal checks both before it believes
anything else in the message.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any, Protocol

from agent.celery_app import CONTROL_QUEUE
from agent.signing import REPORT_TTL_S, key_from_token, sign, token_kid

log = logging.getLogger(__name__)

NODE_REGISTER = "control.node_register"
NODE_HEARTBEAT = "control.node_heartbeat"
JOB_EVENT = "control.job_event"
SAMPLES_INGEST = "control.samples_ingest"
JOB_LOGS_REPORT = "control.job_logs_report"
COMMAND_REFUSED = "control.command_refused"


class TaskSender(Protocol):
    """The one method of a Celery app the reporter uses (tests pass a recorder)."""

    def send_task(self, name: str, args: Any = None, **options: Any) -> Any: ...


class ControlReporter:
    """Sends reports; keeps job events that could not be sent and retries them.

    Job events matter (they move jobs through their lifecycle), so a broker
    outage must not lose them: they wait in an outbox that ``flush_outbox``
    retries. Samples and heartbeats are dropped instead, since the next ones
    supersede them.
    """

    def __init__(self, app: TaskSender, node: str, token: str, *, max_outbox: int = 10_000):
        self._app = app
        self._node = node
        self._key = key_from_token(token)
        self._kid = token_kid(token)
        self._outbox: deque[dict[str, Any]] = deque(maxlen=max_outbox)
        self._lock = threading.Lock()

    def _send(self, name: str, *args: Any) -> None:
        # Signed at each try, so an event that waited in the outbox leaves fresh.
        auth = sign(
            self._key,
            kid=self._kid,
            task=name,
            node=self._node,
            args=list(args),
            ttl_s=REPORT_TTL_S,
        )
        self._app.send_task(name, args=[self._node, auth, *args], queue=CONTROL_QUEUE)

    def register(self, info: dict[str, Any]) -> None:
        """Send ``control.node_register``; raise if the broker is unreachable."""
        self._send(NODE_REGISTER, info)

    def heartbeat(self, info: dict[str, Any]) -> bool:
        return self._try(NODE_HEARTBEAT, info)

    def samples(self, samples: list[dict[str, Any]]) -> bool:
        return self._try(SAMPLES_INGEST, samples)

    def job_logs(self, job_id: int, text: str) -> bool:
        return self._try(JOB_LOGS_REPORT, job_id, text)

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
        return False

    def flush_outbox(self) -> int:
        """Retry waiting events in order; stop at the first failure. Return how many remain."""
        while True:
            with self._lock:
                if not self._outbox:
                    return 0
                event = self._outbox[0]
            if not self._try(JOB_EVENT, event):
                with self._lock:
                    return len(self._outbox)
            with self._lock:
                if self._outbox and self._outbox[0] is event:
                    self._outbox.popleft()

    @property
    def pending_events(self) -> int:
        with self._lock:
            return len(self._outbox)

    def _try(self, name: str, *args: Any) -> bool:
        try:
            self._send(name, *args)
        except Exception as exc:  # kombu raises many kinds; all mean "not sent"
            log.warning("could not send %s: %s", name, exc)
            return False
        return True

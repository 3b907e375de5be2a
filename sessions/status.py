"""A running session's state as its node's gateway sees it: ready, last activity, connections."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import requests

from jobqueue.models import Job
from sessions.errors import NoSuchSession, NotReachable
from sessions.selectors import gateway_target

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class SessionStatus:
    ready: bool
    last_activity: float | None = None
    connections: int = 0
    # Why it is not known (the gateway did not answer); empty when it answered.
    problem: str = ""


def session_status(job: Job, *, username: str) -> SessionStatus:
    """Ask the job's gateway (a ``probe`` ticket); never raises for a gateway that is away."""
    try:
        target = gateway_target(job, purpose="probe", username=username)
    except (NotReachable, NoSuchSession) as exc:
        return SessionStatus(ready=False, problem=str(exc.message))
    try:
        answer = requests.get(target.url, headers=target.headers, timeout=PROBE_TIMEOUT_S)
    except requests.RequestException as exc:
        log.info("gateway of job %s did not answer: %s", job.pk, exc)
        return SessionStatus(ready=False, problem="gateway unreachable")
    if answer.status_code == 503:
        return SessionStatus(ready=False)
    if answer.status_code != 200:
        log.warning(
            "gateway of job %s answered %s: %s", job.pk, answer.status_code, answer.text[:200]
        )
        return SessionStatus(ready=False, problem=f"gateway answered {answer.status_code}")
    try:
        data = answer.json()
        last = data.get("last_activity")
        return SessionStatus(
            ready=bool(data.get("ready")),
            last_activity=float(last) if isinstance(last, (int, float)) else None,
            connections=int(data.get("connections") or 0),
        )
    except (ValueError, TypeError, AttributeError):
        return SessionStatus(ready=False, problem="gateway answered no JSON object")

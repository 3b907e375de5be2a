"""A running session's state: ready, last activity, connections, busy kernels.

The node's gateway says whether the server accepts connections and when anything last
went through it (a page, a WebSocket frame, a key typed). For JupyterLab the server's
own account is read too, as JupyterHub's idle culler reads it: ``/api/status`` (its
``last_activity``, which counts kernel output) and ``/api/kernels`` (a kernel that is
``busy`` runs a cell, so the session is in use now even if nothing is printed). These
reads carry ``tickets.PROBE_HEADER`` and ``no_track_activity``, so reading does not
count as use.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import requests

from jobqueue.models import Job
from protocol import tickets
from sessions.errors import NoSuchSession, NotReachable
from sessions.selectors import gateway_target

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class SessionStatus:
    ready: bool
    last_activity: float | None = None
    connections: int = 0
    # A kernel of the server runs a cell now (JupyterLab only).
    busy: bool = False
    # Why it is not known (the gateway did not answer); empty when it answered.
    problem: str = ""


def session_status(job: Job, *, username: str, activity: bool = True) -> SessionStatus:
    """Ask the job's gateway (a ``probe`` ticket); never raises for a gateway that is away.
    ``activity=False``: readiness alone (the session page's poll), without asking the
    server for its own account."""
    try:
        target = gateway_target(job, purpose="probe", username=username)
    except (NotReachable, NoSuchSession) as exc:
        return SessionStatus(ready=False, problem=str(exc.message))
    try:
        answer = requests.get(target.url, headers=target.headers, timeout=PROBE_TIMEOUT_S)
    except requests.RequestException as exc:
        log.info("gateway of job %s did not answer: %s", job.pk, exc)
        return SessionStatus(ready=False, problem="gateway unreachable")
    if target.direct:
        return _direct_status(job, answer, activity=activity, username=username)
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
        status = SessionStatus(
            ready=bool(data.get("ready")),
            last_activity=float(last) if isinstance(last, (int, float)) else None,
            connections=int(data.get("connections") or 0),
        )
    except (ValueError, TypeError, AttributeError):
        return SessionStatus(ready=False, problem="gateway answered no JSON object")
    if activity and status.ready and job.kind == Job.Kind.JUPYTER:
        return _with_server_activity(job, status, username=username)
    return status


def _direct_status(
    job: Job, answer: requests.Response, *, activity: bool, username: str
) -> SessionStatus:
    """Slurm mode: the server's own ``/api/status`` answered; ready once it says 200."""
    if answer.status_code != 200:
        return SessionStatus(ready=False)
    status = SessionStatus(ready=True)
    if not activity:
        return status
    try:
        server: Any = answer.json()  # the probe was the server's own /api/status
    except ValueError:
        server = None
    return _with_server_activity(job, status, username=username, server=server)


def _with_server_activity(
    job: Job, status: SessionStatus, *, username: str, server: Any = None
) -> SessionStatus:
    """``status`` with Jupyter's own last activity and busy kernels added (``server``: its
    /api/status if already read). A server that does not answer them (an image with
    another server) keeps the gateway's account."""
    if server is None:
        server = _server_json(job, "api/status", username=username)
    kernels = _server_json(job, "api/kernels", username=username)
    moments = [status.last_activity]
    if isinstance(server, dict):
        moments.append(_timestamp(server.get("last_activity")))
    busy = False
    if isinstance(kernels, list):
        for kernel in kernels:
            if isinstance(kernel, dict):
                moments.append(_timestamp(kernel.get("last_activity")))
                busy = busy or kernel.get("execution_state") == "busy"
    known = [m for m in moments if m is not None]
    return SessionStatus(
        ready=status.ready,
        last_activity=max(known) if known else None,
        connections=status.connections,
        busy=busy,
    )


def _server_json(job: Job, rest: str, *, username: str) -> Any:
    try:
        target = gateway_target(
            job, purpose="http", username=username, rest=f"sessions/{job.pk}/{rest}"
        )
        answer = requests.get(
            target.url,
            params={"no_track_activity": "1"},
            headers={**target.headers, tickets.PROBE_HEADER: "1"},
            timeout=PROBE_TIMEOUT_S,
        )
    except (NotReachable, NoSuchSession, requests.RequestException) as exc:
        log.info("job %s's server did not answer %s: %s", job.pk, rest, exc)
        return None
    if answer.status_code != 200:
        return None
    try:
        return answer.json()
    except ValueError:
        return None


def _timestamp(value: Any) -> float | None:
    """Jupyter's ISO 8601 time (``2026-12-03T11:22:33.123456Z``) as a Unix time."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None

"""Who may reach which job through the proxy, and where its node's gateway is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.utils.translation import gettext as _

from accounts.models import User
from cluster.signing import node_signing_keys
from jobqueue import executor as executors
from jobqueue.models import Job
from protocol import tickets
from sessions.errors import NoSuchSession, NotReachable, NotSignedIn, NotYours
from sessions.launch import session_token

# The gateway path of each purpose (sessions-contract: the agent's gateway API).
GATEWAY_PATHS = {"http": "proxy", "exec": "exec", "probe": "status"}


@dataclass(frozen=True)
class GatewayTarget:
    """One request's way to a job through its node's gateway: base URL and headers to add."""

    url: str
    headers: dict[str, str]
    # The server itself (Slurm mode), not a gateway: a probe reads Jupyter's /api/status.
    direct: bool = False


def job_reachable_by(user: User | Any, job_id: int) -> Job:
    """The job, if ``user`` may open a path to it (its owner, or staff); else why not.

    Another member gets NotYours, not NoSuchSession: the job list already tells members
    whose jobs exist, and a 403 is the clearer answer.
    """
    if not getattr(user, "is_authenticated", False):
        raise NotSignedIn(_("Sign in to open this session."))
    job = Job.objects.select_related("node", "owner").filter(pk=job_id).first()
    if job is None:
        raise NoSuchSession(_("There is no job #%(id)d.") % {"id": job_id})
    if job.owner_id != user.pk and not user.is_staff:
        raise NotYours(
            _("Job #%(id)d is not yours: only its owner and staff may open it.") % {"id": job_id}
        )
    return job


def gateway_target(
    job: Job, *, purpose: tickets.Purpose, username: str, rest: str = ""
) -> GatewayTarget:
    """Where to send a request for ``job``, with a ticket for ``purpose`` (and, for the
    session's own server, its token). ``username``: who asks, for the gateway's log.
    NotReachable while there is nothing to reach."""
    direct = not executors.current().portal_schedules
    if job.state != Job.State.RUNNING or (job.node is None and not direct):
        raise NotReachable(
            _("Job #%(id)d is not running (it is %(state)s).")
            % {"id": job.pk, "state": job.get_state_display()}
        )
    if purpose == "http" and job.kind != Job.Kind.JUPYTER:
        raise NoSuchSession(
            _("Job #%(id)d runs no server to open; open its terminal.") % {"id": job.pk}
        )
    if direct:
        return _direct_target(job, purpose=purpose, rest=rest)
    node = job.node
    assert node is not None  # checked above
    if not node.gateway_url:
        raise NotReachable(
            _(
                "Node %(node)s has no gateway, so its jobs cannot be opened from the browser; an admin starts its agent with --gateway-listen."
            )
            % {"node": node.name}
        )
    keys = node_signing_keys(node.name)
    if not keys:
        raise NotReachable(_("Node %(node)s has no active token.") % {"node": node.name})
    ticket = tickets.issue(
        keys,
        node=node.name,
        job_id=job.pk,
        attempt=job.dispatch_count,
        purpose=purpose,
        user=username,
    )
    headers = {tickets.HEADER: ticket}
    if purpose == "http":
        headers["Authorization"] = (
            f"token {session_token(job_id=job.pk, attempt=job.dispatch_count)}"
        )
    base = node.gateway_url.rstrip("/")
    url = f"{base}/jobs/{job.pk}/{GATEWAY_PATHS[purpose]}"
    if purpose == "http":
        url = f"{url}/{rest.lstrip('/')}"
    return GatewayTarget(url=url, headers=headers)


def _direct_target(job: Job, *, purpose: tickets.Purpose, rest: str) -> GatewayTarget:
    """Slurm mode: the session's server on its node, reached straight from the portal with
    its token (no gateway, no ticket); a shell in a job is not offered."""
    if purpose == "exec":
        raise NotReachable(
            _(
                "On this Slurm cluster a job's shell is not opened from the portal; in a JupyterLab session open File → New → Terminal."
            )
        )
    server = executors.current().session_server(job)
    if server is None:
        raise NotReachable(
            _("Job #%(id)d's server has not said where it listens yet.") % {"id": job.pk}
        )
    headers = {"Authorization": f"token {session_token(job_id=job.pk, attempt=job.dispatch_count)}"}
    path = rest.lstrip("/") if purpose == "http" else f"sessions/{job.pk}/api/status"
    return GatewayTarget(url=f"{server}/{path}", headers=headers, direct=True)


def job_page_links(job: Job) -> dict[str, Any]:
    """What the job page shows of sessions: the session page and the terminal."""
    return {
        "session_page": job.is_session,
        "terminal_available": job.state == Job.State.RUNNING and bool(job.node_id),
    }

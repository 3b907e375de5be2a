"""Messages from the portal to node agents, on the queue node.<name>, sent after commit."""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from django.conf import settings
from django.db import transaction

from cluster.models import Node
from cluster.signing import command_auth
from files.places import job_directory
from jobqueue.models import SchedulingPolicy
from protocol.messages import Mount, StartJob
from sessions.launch import session_dispatch

logger = logging.getLogger(__name__)

PIDS_LIMIT = 4096


def _send(task: str, args: list[Any], node: Node) -> None:
    """Send a signed command to the node's agent after commit (agents refuse unsigned ones)."""
    from core.portal_app import portal_app

    app = portal_app()

    def send() -> None:
        try:
            auth = command_auth(node_name=node.name, task=task, args=args)
            app.send_task(task, args=args, kwargs={"auth": auth}, queue=node.queue_name)
        except Exception:  # broker away: the heartbeat reconcile re-sends a start, the beat a stop
            logger.exception("could not send %s to %s", task, node.queue_name)

    transaction.on_commit(send)


def _preemption_env(job: Any) -> dict[str, str]:
    """A preemptible job is told how long it has to checkpoint between SIGTERM and SIGKILL
    (docs/jobs.md, "Preemptible jobs")."""
    if not job.preemptible:
        return {}
    return {"LABPORTAL_PREEMPT_GRACE_S": str(int(SchedulingPolicy.current().stop_grace_s))}


def start_spec(job: Any, gpus: list[Any]) -> dict[str, Any]:
    """The `agent.start_job` payload (`protocol.messages.StartJob`): everything the agent
    needs, nothing it must look up."""
    uid, gid = job.owner.ensure_unix_ids()
    session_env, session = session_dispatch(
        job_id=job.pk, attempt=job.dispatch_count, kind=job.kind
    )
    spec = StartJob(
        job_id=job.pk,
        attempt=job.dispatch_count,
        image=job.image.reference,
        command=list(job.command),
        env={**job.env, **session_env, **_preemption_env(job), "LABPORTAL_JOB_ID": str(job.pk)},
        gpu_uuids=[g.uuid for g in gpus],
        gpu_indices=sorted({(g.parent.index if g.parent_id else g.index) for g in gpus}),
        uid=uid,
        gid=gid,
        username=job.owner.username,
        cpus=float(job.cpus),
        memory_mb=int(job.memory_mb),
        pids_limit=getattr(settings, "LABPORTAL_PIDS_LIMIT", PIDS_LIMIT),
        mounts=[
            Mount(source=m.source_for(job.owner.username), target=m.target, read_only=m.read_only)
            for m in job.mounts.all()
        ],
        time_limit_s=int(job.time_limit_s),
        network="egress" if job.queue.network_egress else "none",
        job_dir=job_directory(username=job.owner.username, job_id=job.pk),
        session=session,
    )
    wire: dict[str, Any] = msgspec.to_builtins(spec)
    return wire


def send_start(*, node: Node, spec: dict[str, Any]) -> None:
    _send("agent.start_job", [spec], node)


def send_stop(*, node: Node, job_id: int, grace_s: int, reason: str) -> None:
    _send("agent.stop_job", [job_id, grace_s, reason], node)


def send_logs_request(*, node: Node, job_id: int, tail: int = 200) -> None:
    _send("agent.job_logs", [job_id, tail], node)


def send_cleanup(*, node: Node, job_ids: list[int]) -> None:
    """Ask the agent to remove what these ended jobs left behind (alerts: memory leaks)."""
    _send("agent.cleanup_ended_jobs", [job_ids], node)

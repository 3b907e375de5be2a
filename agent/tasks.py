"""The tasks the portal sends to ``node.<name>``: thin wrappers over ``NodeAgent``.

They take plain JSON arguments (never objects) and are safe to run twice.
``agent.main`` installs the node's ``NodeAgent`` with ``set_node_agent``
before the worker starts consuming.
"""

from __future__ import annotations

from typing import Any

from agent.celery_app import app
from agent.node import NodeAgent

_node_agent: NodeAgent | None = None


def set_node_agent(node_agent: NodeAgent | None) -> None:
    global _node_agent
    _node_agent = node_agent


def get_node_agent() -> NodeAgent:
    if _node_agent is None:
        raise RuntimeError("the node agent is not set up; start it with `labportal-agent`")
    return _node_agent


# Every command must carry the portal's signature (``auth``, see protocol.signing);
# an unsigned, forged, expired or replayed one is refused before anything runs.


@app.task(name="agent.start_job", bind=True)
def start_job(self: Any, spec: dict[str, Any], auth: Any = None) -> dict[str, Any]:
    """Start a job's container unless it already has one on this node."""
    node_agent = get_node_agent()
    if (refusal := node_agent.refuse_unless_signed("agent.start_job", [spec], auth)) is not None:
        return refusal
    return node_agent.start_job(spec, delivery_id=self.request.id)


@app.task(name="agent.stop_job")
def stop_job(job_id: int, grace_s: int, reason: str, auth: Any = None) -> dict[str, Any]:
    """SIGTERM the job, wait ``grace_s`` seconds, then SIGKILL; report ``exited``."""
    node_agent = get_node_agent()
    args = [job_id, grace_s, reason]
    if (refusal := node_agent.refuse_unless_signed("agent.stop_job", args, auth)) is not None:
        return refusal
    return node_agent.stop_job(int(job_id), float(grace_s), str(reason))


@app.task(name="agent.job_logs")
def job_logs(job_id: int, tail: int, auth: Any = None) -> dict[str, Any]:
    """Answer with ``control.job_logs_report`` carrying the last ``tail`` lines."""
    node_agent = get_node_agent()
    if (
        refusal := node_agent.refuse_unless_signed("agent.job_logs", [job_id, tail], auth)
    ) is not None:
        return refusal
    node_agent.job_logs(int(job_id), int(tail))
    return {"ok": True}


@app.task(name="agent.cleanup_ended_jobs")
def cleanup_ended_jobs(job_ids: list[int], auth: Any = None) -> dict[str, Any]:
    """Kill leftover processes and remove containers of these ended jobs (only theirs)."""
    node_agent = get_node_agent()
    args = [job_ids]
    if (
        refusal := node_agent.refuse_unless_signed("agent.cleanup_ended_jobs", args, auth)
    ) is not None:
        return refusal
    return node_agent.cleanup_ended_jobs(list(job_ids or []))

"""Small builders for engine inputs, so each test states only what it is about."""

from __future__ import annotations

from typing import Any

from scheduler.model import (
    CategoryPolicy,
    ClusterState,
    Gpu,
    GpuKind,
    Node,
    NodeState,
    PendingJob,
    Policy,
    QueuePolicy,
    Reservation,
    RunningJob,
    ShareNode,
)

HOUR = 3600.0
NOW = 1_000_000.0

QUEUES = {
    "high": QueuePolicy("high", tier=0, priority_factor=1.0),
    "normal": QueuePolicy("normal", tier=1, priority_factor=0.5),
    "debug": QueuePolicy("debug", tier=1, priority_factor=0.5, max_wall_s=HOUR),
}


def policy(**overrides: Any) -> Policy:
    values: dict[str, Any] = {"queues": QUEUES}
    values.update(overrides)
    return Policy(**values)


def gpus_for(
    nodes: int = 2, per_node: int = 4, model: str = "A100", memory_mb: int = 40_000
) -> tuple[Gpu, ...]:
    return tuple(
        Gpu(f"n{n}-g{i}", f"n{n}", model, memory_mb) for n in range(nodes) for i in range(per_node)
    )


def nodes_for(
    gpus: tuple[Gpu, ...], states: dict[str, NodeState] | None = None
) -> tuple[Node, ...]:
    names = sorted({g.node for g in gpus})
    states = states or {}
    return tuple(Node(name, states.get(name, NodeState.UP)) for name in names)


def slots_for(node: str, parent: str, count: int) -> tuple[Gpu, ...]:
    return tuple(
        Gpu(f"{parent}-s{i}", node, "A100", 10_000, GpuKind.SLOT, parent) for i in range(count)
    )


def job(job_id: int, user: str = "alice", queue: str = "normal", **kw: Any) -> PendingJob:
    kw.setdefault("submit_time", NOW - 100.0 + job_id)
    return PendingJob(id=job_id, user=user, queue=queue, **kw)


def running(job_id: int, gpu_ids: tuple[str, ...], user: str = "bob", **kw: Any) -> RunningJob:
    kw.setdefault("start_time", NOW - HOUR)
    kw.setdefault("time_limit_s", 2 * HOUR)
    kw.setdefault("queue", "normal")
    return RunningJob(id=job_id, user=user, gpu_ids=gpu_ids, **kw)


def state(
    gpus: tuple[Gpu, ...] | None = None,
    pending: tuple[PendingJob, ...] = (),
    running_jobs: tuple[RunningJob, ...] = (),
    reservations: tuple[Reservation, ...] = (),
    node_states: dict[str, NodeState] | None = None,
    **kw: Any,
) -> ClusterState:
    gpus = gpus if gpus is not None else gpus_for()
    return ClusterState(
        nodes=nodes_for(gpus, node_states),
        gpus=gpus,
        pending=pending,
        running=running_jobs,
        reservations=reservations,
        **kw,
    )


def flat_tree(*users: str) -> ShareNode:
    return ShareNode("root", 1, tuple(ShareNode(u, 1) for u in users))


__all__ = [
    "HOUR",
    "NOW",
    "CategoryPolicy",
    "Reservation",
    "flat_tree",
    "gpus_for",
    "job",
    "policy",
    "running",
    "slots_for",
    "state",
]

"""Reads shared by the pages, the API and the agent-message services."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.apps import apps
from django.conf import settings

from cluster.models import Gpu, Node

# The job queue (layer 3) sits above the cluster (layer 2): its models are looked up by
# name through the app registry, never imported. The job queue is always installed.


def jobs_on_node(*, node_id: int, job_ids: Iterable[int]) -> set[int]:
    """Those of `job_ids` that the portal gave to this node, whatever their state now.

    Not only running ones: an agent rightly reports the exit of a job the portal
    already finished, lost or cancelled (a redelivery, or a reconcile after restart).
    A job requeued onto another node is no longer this node's.
    """
    ids = {job_id for job_id in job_ids}
    if not ids:
        return set()
    job_model = apps.get_model("jobqueue", "Job")
    return set(job_model.objects.filter(pk__in=ids, node_id=node_id).values_list("pk", flat=True))


def job_is_on_node(*, job_id: int, node_id: int) -> bool:
    return job_id in jobs_on_node(node_id=node_id, job_ids=[job_id])


def job_is_on_named_node(*, job_id: int, node_name: str) -> bool:
    """Whether the portal gave this job to the node of that name (see `jobs_on_node`)."""
    job_model = apps.get_model("jobqueue", "Job")
    return bool(job_model.objects.filter(pk=job_id, node__name=node_name).exists())


@dataclass
class LiveGpu:
    """One device row of the live page, with whoever is using it (its shared slots included)."""

    gpu: Gpu
    allocations: list[Any] = field(default_factory=list)
    slots_total: int = 0
    slots_used: int = 0

    @property
    def sample_stale(self) -> bool:
        age = self.gpu.sample_age()
        return age is None or age > timedelta(seconds=settings.LABPORTAL_NODE_DOWN_AFTER_S)

    @property
    def mem_used_pct(self) -> float | None:
        if self.gpu.mem_used_mb is None or not self.gpu.memory_mb:
            return None
        return 100.0 * self.gpu.mem_used_mb / self.gpu.memory_mb


@dataclass
class LiveNode:
    node: Node
    gpus: list[LiveGpu]

    @property
    def heartbeat_late(self) -> bool:
        age = self.node.heartbeat_age()
        return age is None or age > timedelta(seconds=settings.LABPORTAL_NODE_DOWN_AFTER_S)


def nodes_for_live_page() -> list[LiveNode]:
    """Every node with its devices (whole GPUs and MIG instances), their users and jobs."""
    nodes = list(Node.objects.all())
    gpus_by_node: dict[int, list[Gpu]] = defaultdict(list)
    for gpu in Gpu.objects.select_related("held_by_user").order_by("index", "kind", "uuid"):
        gpus_by_node[gpu.node_id].append(gpu)
    allocations = active_allocations_by_gpu(
        gpu.pk for gpus in gpus_by_node.values() for gpu in gpus
    )
    live_nodes = []
    for node in nodes:
        node_gpus = gpus_by_node[node.pk]
        for gpu in node_gpus:
            gpu.node = node  # the row's label names its node; no query per GPU
        rows = {
            gpu.pk: LiveGpu(gpu, list(allocations.get(gpu.pk, [])))
            for gpu in node_gpus
            if gpu.kind != Gpu.Kind.SLOT
        }
        for slot in node_gpus:
            if (
                slot.kind == Gpu.Kind.SLOT
                and slot.parent_id in rows
                and slot.state != Gpu.State.MISSING
            ):
                row = rows[slot.parent_id]
                row.slots_total += 1
                slot_allocations = allocations.get(slot.pk, [])
                row.slots_used += bool(slot_allocations)
                row.allocations.extend(slot_allocations)
        live_nodes.append(LiveNode(node, list(rows.values())))
    return live_nodes


def active_allocations_by_gpu(gpu_ids: Iterable[int]) -> dict[int, list[Any]]:
    """Active allocations (with job and owner loaded) of these GPUs, by GPU id."""
    allocation_model = apps.get_model("jobqueue", "Allocation")
    by_gpu: dict[int, list[Any]] = defaultdict(list)
    active = allocation_model.objects.filter(active=True, gpu_id__in=list(gpu_ids))
    for allocation in active.select_related("job__owner").order_by("job_id"):
        by_gpu[allocation.gpu_id].append(allocation)
    return by_gpu

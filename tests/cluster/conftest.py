"""Helpers for the agent protocol's tests: node tokens, registration payloads, jobs on nodes."""

from __future__ import annotations

import importlib
import sys
import types
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from cluster.models import ControlClock, Node, NodeToken
from tests.factories import GpuFactory, NodeFactory


@pytest.fixture
def issue_token(db: Any) -> Any:
    def issue(node_name: str) -> str:
        _token, secret = NodeToken.issue(node_name=node_name)
        return secret

    return issue


def gpu_entry(uuid: str, index: int = 0, **overrides: Any) -> dict[str, Any]:
    entry = {
        "uuid": uuid,
        "index": index,
        "model": "NVIDIA H100 80GB HBM3",
        "memory_mb": 81559,
        "kind": "gpu",
        "parent_uuid": None,
    }
    entry.update(overrides)
    return entry


def register_info(*gpus: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    info = {
        "hostname": "gpu01.lab.example",
        "agent_version": "0.1.0",
        "gpu_backend": "nvml",
        "runtime": "docker",
        "gpus": list(gpus),
    }
    info.update(overrides)
    return info


@pytest.fixture
def registered_node(issue_token: Any) -> Any:
    """gpu01, registered with two GPUs; returns (node, secret)."""
    from cluster.tasks import node_register

    secret = issue_token("gpu01")
    node_register("gpu01", secret, register_info(gpu_entry("GPU-aaa", 0), gpu_entry("GPU-bbb", 1)))
    return Node.objects.get(name="gpu01"), secret


@pytest.fixture
def control_heard_throughout(db: Any, settings: Any) -> None:
    """The control side heard every liveness beat between the test's jumps in time.

    Without it a jump reads as a gap in which nothing could be heard (see
    `ControlClock`), and node silence counts only from the jump.
    """
    settings.LABPORTAL_LIVENESS_CHECK_S = 10**6
    week_ago = timezone.now() - timedelta(days=7)
    ControlClock.objects.create(pk=1, last_check_at=week_ago, listening_since=week_ago)


@pytest.fixture
def other_node(db: Any) -> Node:
    node = NodeFactory.create(name="gpu02", registered_at=timezone.now())
    GpuFactory(node=node, index=0, uuid="GPU-other-0")
    return node


def job_on(node: Node | None, owner: Any, *, name: str = "train", state: str = "running") -> Any:
    from jobqueue.models import ContainerImage, Job, Queue

    queue, _ = Queue.objects.get_or_create(name="normal", defaults={"title": "Normal"})
    image, _ = ContainerImage.objects.get_or_create(reference="pytorch/pytorch:2.4.0")
    return Job.objects.create(
        owner=owner,
        queue=queue,
        image=image,
        command=["python", "train.py"],
        time_limit_s=3600,
        name=name,
        node=node,
        state=state,
    )


@dataclass
class JobqueueCalls:
    """What the cluster asked of the job queue's services, recorded instead of run."""

    events: list[dict[str, Any]] = field(default_factory=list)
    logs: list[dict[str, Any]] = field(default_factory=list)
    lost: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
def jobqueue_calls(monkeypatch: pytest.MonkeyPatch) -> JobqueueCalls:
    """Record the calls into scheduling.agent_events (works before that module exists, too)."""
    try:
        module = importlib.import_module("scheduling.agent_events")
    except ImportError:
        module = types.ModuleType("scheduling.agent_events")
        monkeypatch.setitem(sys.modules, "scheduling.agent_events", module)
    calls = JobqueueCalls()

    def job_event_apply(*, node_name: str, event: dict[str, Any]) -> None:
        calls.events.append({"node_name": node_name, "event": event})

    def job_logs_store(*, job_id: int, text: str) -> None:
        calls.logs.append({"job_id": job_id, "text": text})

    def jobs_mark_lost_on_node(*, node_id: int, reason: str) -> int:
        calls.lost.append({"node_id": node_id, "reason": reason})
        return 1

    for fake in (job_event_apply, job_logs_store, jobs_mark_lost_on_node):
        monkeypatch.setattr(module, fake.__name__, fake, raising=False)
    return calls

"""Alerts and shared slots end to end with real processes: PostgreSQL, Redis, a control worker
with beat, and an agent on simulated GPUs running jobs as local processes.

The simulated backend is told, through each job's LABPORTAL_SIMULATE, to produce an
idle job and a leak after a job ends; the portal's rules find both, the real agent
cleans up the leak, and two debug jobs share one GPU while a third waits.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from accounts.models import Notification
from alerts.models import Alert, AlertRule, Kind
from alerts.services import alerts_evaluate
from cluster.models import Gpu, Node, NodeToken
from cluster.services import gpu_set_shared_slots
from jobqueue.models import ContainerImage, Job
from labportal.devstack import Stack
from tests.conftest import api_as, require_in_ci
from tests.e2e.test_jobs_end_to_end import stack_env, wait_until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
]

IMAGE = "labportal/busybox:test"  # the local runtime ignores it; the allowlist does not


@pytest.fixture
def stack(tmp_path: Path) -> Any:
    if not settings.CELERY_BROKER_URL.startswith("redis://"):
        require_in_ci("a Redis broker (CELERY_BROKER_URL=redis://…)")
    running = Stack(env=stack_env(tmp_path), log_dir=tmp_path / "logs")
    yield running
    running.stop()


def submit(api: Any, *, command: str, simulate: str = "", **extra: Any) -> int:
    response = api.post(
        "/api/jobs/",
        {
            "image": IMAGE,
            "time_limit_s": 600,
            "cpus": "0.5",
            "memory_mb": 128,
            "command": ["sh", "-c", command],
            "env": {"LABPORTAL_SIMULATE": simulate} if simulate else {},
            **extra,
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    return int(response.json()["id"])


def test_an_idle_job_is_warned_a_leak_is_cleaned_up_and_two_debug_jobs_share_a_gpu(
    stack: Stack, alice: Any, bob: Any, admin_user: Any, queues: Any, tmp_path: Path
) -> None:
    node_name = f"e2e-{uuid.uuid4().hex[:6]}"
    _token, secret = NodeToken.issue(node_name=node_name)
    ContainerImage.objects.create(reference=IMAGE)
    # Short windows, so that the test takes seconds: the rules are the same.
    AlertRule.objects.create(kind=Kind.IDLE_JOB, threshold=5, window_s=12, grace_s=600)
    AlertRule.objects.create(kind=Kind.MEMORY_LEAK, threshold=256, window_s=10, grace_s=600)
    stack.control_worker(tmp_path / "beat-schedule")
    stack.agent(
        name=node_name,
        token=secret,
        broker=settings.CELERY_BROKER_URL,
        runtime="local",
        gpus=3,
        state_dir=tmp_path / "agent",
        extra_env={"LABPORTAL_SAMPLE_BATCH": "1", "LABPORTAL_SAMPLE_INTERVAL": "1"},
    )
    wait_until(
        lambda: Gpu.objects.filter(node__name=node_name, node__state=Node.State.UP).count() == 3,
        timeout_s=90,
        stack=stack,
        what="the agent to register its 3 simulated GPUs",
    )
    shared = Gpu.objects.get(node__name=node_name, index=0)
    gpu_set_shared_slots(gpu_id=shared.pk, slots=2)

    # Two debug jobs share GPU 0 through its slots; a third waits.
    debug = [
        submit(api_as(alice), command="sleep 60", queue="debug", shared_slot=True) for _ in range(3)
    ]
    wait_until(
        lambda: Job.objects.filter(pk__in=debug, state=Job.State.RUNNING).count() == 2,
        timeout_s=60,
        stack=stack,
        what="two debug jobs running on the shared GPU",
    )
    running = Job.objects.filter(pk__in=debug, state=Job.State.RUNNING)
    assert {a.gpu.parent_id for j in running for a in j.allocations.filter(active=True)} == {
        shared.pk
    }
    assert Job.objects.get(pk=debug[2]).state == Job.State.PENDING

    # An idle job on a whole GPU, and one that leaks its memory when it ends.
    idle = submit(api_as(alice), command="sleep 120", simulate="idle", gpus=1)
    leaky = submit(api_as(bob), command="sleep 2", simulate="leak", gpus=1)

    def evaluated_alert(kind: str, **filters: Any) -> Any:
        alerts_evaluate()  # beat runs it every 30 s too; the test does not wait for beat
        return Alert.objects.open().filter(kind=kind, **filters).first()

    wait_until(
        lambda: evaluated_alert(Kind.IDLE_JOB, job_id=idle),
        timeout_s=90,
        stack=stack,
        what="the idle-job alert",
    )
    assert Notification.objects.filter(user=alice, kind="alert_idle_job").exists()
    wait_until(
        lambda: Job.objects.get(pk=leaky).state == Job.State.COMPLETED,
        timeout_s=60,
        stack=stack,
        what="the leaking job to end",
    )
    # Its memory is still held once it has ended: a leak, and the agent is asked to clean up.
    wait_until(
        lambda: evaluated_alert(Kind.MEMORY_LEAK),
        timeout_s=90,
        stack=stack,
        what="the memory-leak alert",
    )
    leak = Alert.objects.get(kind=Kind.MEMORY_LEAK)
    assert leak.params["job_ids"] == [leaky]
    assert Notification.objects.filter(user=admin_user, kind="alert_memory_leak").exists()
    # The agent removed the ended job's leftovers: the memory is free and the alert resolves.
    wait_until(
        lambda: alerts_evaluate() and Alert.objects.get(pk=leak.pk).state == Alert.State.RESOLVED,
        timeout_s=90,
        stack=stack,
        what="the agent's clean-up to free the leaked memory",
    )
    assert "cleaned up after ended jobs" in stack.tail(f"agent-{node_name}", 400)
    assert Alert.objects.open().filter(kind=Kind.IDLE_JOB, job_id=idle).exists()

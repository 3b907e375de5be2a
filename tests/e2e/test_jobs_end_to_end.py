"""End to end with real processes: PostgreSQL, Redis, a control worker with beat, and an agent
running jobs in Docker containers on simulated GPUs (there is no GPU in CI)."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from django.urls import reverse

from cluster.models import Gpu, Node, NodeToken
from jobqueue.models import ContainerImage, Job
from labportal.devstack import Stack
from tests.conftest import api_as, require_in_ci

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.postgres,
    pytest.mark.docker,
    pytest.mark.django_db(transaction=True),
]

TEST_IMAGE = "labportal/busybox:test"
JOBS = 20


def database_url_for_children() -> str:
    db = connection.settings_dict
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{user}{password}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


def stack_env(tmp_path: Path) -> dict[str, str]:
    """The environment of the real processes: this test's database and broker, a var dir
    of their own, and no settings module of the test run."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url_for_children(),
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "LABPORTAL_VAR_DIR": str(tmp_path / "var"),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return env


def docker_ready(image: str = TEST_IMAGE) -> bool:
    try:
        import docker

        client = docker.from_env()
        client.ping()
        client.images.get(image)
        return True
    except Exception:
        return False


def wait_until(condition: Any, *, timeout_s: float, stack: Stack, what: str) -> None:
    """Poll real processes; end-to-end waits are bounded and fail with the processes' logs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        stack.check_alive()
        time.sleep(0.5)
    logs = "\n".join(f"--- {name}\n{stack.tail(name)}" for name in stack.procs)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}\n{logs}")


@pytest.fixture
def stack(tmp_path: Path) -> Any:
    if not settings.CELERY_BROKER_URL.startswith("redis://"):
        require_in_ci("a Redis broker (CELERY_BROKER_URL=redis://…)")
    if not docker_ready():
        require_in_ci(f"a Docker engine with the image {TEST_IMAGE} (bash .ci/docker-setup.sh)")
    running = Stack(env=stack_env(tmp_path), log_dir=tmp_path / "logs")
    yield running
    running.stop()
    if os.environ.get("LABPORTAL_E2E_KEEP_LOGS"):
        shutil.copytree(
            tmp_path / "logs", os.environ["LABPORTAL_E2E_KEEP_LOGS"], dirs_exist_ok=True
        )


def test_twenty_jobs_submitted_through_the_api_complete_in_containers_on_their_gpus(
    stack: Stack, alice: Any, queues: Any, tmp_path: Path
) -> None:
    node_name = f"e2e-{uuid.uuid4().hex[:6]}"
    _token, secret = NodeToken.issue(node_name=node_name)
    ContainerImage.objects.create(reference=TEST_IMAGE)
    stack.control_worker(tmp_path / "beat-schedule")
    stack.agent(
        name=node_name,
        token=secret,
        broker=settings.CELERY_BROKER_URL,
        runtime="docker",
        gpus=4,
        state_dir=tmp_path / "agent",
    )
    wait_until(
        lambda: Gpu.objects.filter(node__name=node_name, node__state=Node.State.UP).count() == 4,
        timeout_s=90,
        stack=stack,
        what="the agent to register its 4 simulated GPUs",
    )

    api = api_as(alice)
    submitted = []
    for i in range(JOBS):
        response = api.post(
            "/api/jobs/",
            {
                "image": TEST_IMAGE,
                "gpus": 1 + i % 2,
                "time_limit_s": 600,
                "cpus": "0.5",
                "memory_mb": 128,
                "command": ["sh", "-c", "echo gpus=$NVIDIA_VISIBLE_DEVICES; sleep 1"],
            },
            format="json",
        )
        assert response.status_code == 201, response.content
        submitted.append(json.loads(response.content)["id"])
    overview = json.loads(api.get("/api/queues/overview/").content)
    listed = {e["id"] for e in overview["waiting"] + overview["running"]}
    assert set(submitted) <= listed | set(
        Job.objects.filter(pk__in=submitted, state__in=Job.FINAL_STATES).values_list(
            "pk", flat=True
        )
    )

    wait_until(
        lambda: Job.objects.filter(pk__in=submitted, state__in=Job.FINAL_STATES).count() == JOBS,
        timeout_s=240,
        stack=stack,
        what=f"{JOBS} jobs to finish",
    )

    jobs = Job.objects.filter(pk__in=submitted).prefetch_related("allocations__gpu", "events")
    for job in jobs:
        assert job.state == Job.State.COMPLETED, (job.pk, job.state, job.end_reason, job.log_tail)
        assert job.exit_code == 0
        uuids = sorted(a.gpu.uuid for a in job.allocations.all())
        assert len(uuids) == job.gpus
        assert all(not a.active for a in job.allocations.all())
        # The container saw exactly the GPUs its allocations name.
        seen = job.log_tail.strip().split("gpus=", 1)[1].split()[0]
        assert sorted(seen.split(",")) == uuids, (job.pk, job.log_tail)
        kinds = [e.kind for e in job.events.all()]
        assert kinds[:4] == ["submitted", "dispatched", "started", "exited"], kinds

    client = Client()
    client.force_login(alice)
    page = client.get(reverse("job_detail", args=[submitted[0]])).content.decode()
    assert "Exited with code 0" in page and "completed" in page

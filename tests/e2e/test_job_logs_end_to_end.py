"""A job's whole output on the real stack: PostgreSQL, Redis, a control worker, the web
process (gunicorn) and an agent running the job as a local process. The job prints
50 MiB; the download equals exactly what it printed."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests
from django.conf import settings

from accounts.models import PersonalAccessToken
from cluster.models import Gpu, Node, NodeToken
from jobqueue.models import ContainerImage, Job
from labportal.devstack import Stack, free_port, wait_for_port
from tests.conftest import api_as, require_in_ci
from tests.e2e.test_jobs_end_to_end import stack_env, wait_until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
]

IMAGE = "labportal/busybox:test"  # the local runtime ignores it; the allowlist does not
LAST = 6_692_488  # `seq 1 LAST` prints exactly 50 MiB


def expected_sha256() -> tuple[str, int]:
    """What the job prints: "started" on stderr, then the numbers 1 to LAST (50 MiB)."""
    digest = hashlib.sha256(b"started\n")
    size = len(b"started\n")
    for start in range(1, LAST + 1, 100_000):
        block = "".join(f"{i}\n" for i in range(start, min(LAST, start + 99_999) + 1)).encode()
        digest.update(block)
        size += len(block)
    return digest.hexdigest(), size


@pytest.fixture
def stack(tmp_path: Path) -> Any:
    if not settings.CELERY_BROKER_URL.startswith("redis://"):
        require_in_ci("a Redis broker (CELERY_BROKER_URL=redis://…)")
    running = Stack(env=stack_env(tmp_path), log_dir=tmp_path / "logs")
    yield running
    running.stop()


def test_a_job_that_prints_50_mib_is_downloaded_exactly_as_printed(
    stack: Stack, alice: Any, queues: Any, tmp_path: Path
) -> None:
    node_name = f"e2e-{uuid.uuid4().hex[:6]}"
    _token, secret = NodeToken.issue(node_name=node_name)
    ContainerImage.objects.create(reference=IMAGE)
    port = free_port()
    stack.web(port)
    stack.control_worker(tmp_path / "beat-schedule", concurrency=2)
    stack.agent(
        name=node_name,
        token=secret,
        broker=settings.CELERY_BROKER_URL,
        runtime="local",
        gpus=1,
        state_dir=tmp_path / "agent",
    )
    wait_until(
        lambda: Gpu.objects.filter(node__name=node_name, node__state=Node.State.UP).count() == 1,
        timeout_s=90,
        stack=stack,
        what="the agent to register its simulated GPU",
    )
    response = api_as(alice).post(
        "/api/jobs/",
        {
            "image": IMAGE,
            "time_limit_s": 600,
            "cpus": "0.5",
            "memory_mb": 128,
            "command": ["sh", "-c", f"echo started >&2; seq 1 {LAST - 1}; sleep 1; echo {LAST}"],
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    job_id = int(response.json()["id"])
    wait_for_port(port)
    _t, token = PersonalAccessToken.issue(user=alice, name="e2e")
    auth = {"Authorization": f"Bearer {token}"}
    base = f"http://127.0.0.1:{port}/api/jobs/{job_id}/log/"

    # Followed while it runs: the first lines arrive before the job ends.
    def first_lines() -> bool:
        body = requests.get(base, params={"offset": 0, "limit": 64}, headers=auth, timeout=10)
        return body.status_code == 200 and body.json()["text"].startswith("started\n1\n2\n")

    wait_until(first_lines, timeout_s=60, stack=stack, what="the job's first output")
    wait_until(
        lambda: Job.objects.get(pk=job_id).is_final,
        timeout_s=300,
        stack=stack,
        what="the job to end",
    )
    job = Job.objects.get(pk=job_id)
    assert job.state == Job.State.COMPLETED, (job.state, job.end_reason)
    status = requests.get(base, params={"tail": 1}, headers=auth, timeout=10).json()
    assert status["complete"] and status["text"] == f"{LAST}\n", status
    assert status["dropped_bytes"] == 0

    digest, size = expected_sha256()
    got = hashlib.sha256()
    with requests.get(base + "download/", headers=auth, stream=True, timeout=60) as download:
        assert download.status_code == 200
        assert download.headers["Content-Disposition"] == f'attachment; filename="job-{job_id}.log"'
        received = 0
        for block in download.iter_content(1024 * 1024):
            got.update(block)
            received += len(block)
    assert received == size
    assert got.hexdigest() == digest
    print(json.dumps({"job": job_id, "bytes": received}))

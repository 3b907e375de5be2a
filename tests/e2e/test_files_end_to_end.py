"""End to end with real processes: the agent makes a job's folder, the job (local runtime)
writes a file there, and the portal lists and downloads it through the files API."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from cluster.models import Gpu, Node, NodeToken
from jobqueue.models import ContainerImage, Job
from labportal.devstack import Stack
from tests.conftest import api_as, require_in_ci
from tests.e2e.test_jobs_end_to_end import TEST_IMAGE, stack_env, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def job_root(tmp_path: Path, settings: Any) -> Path:
    root = tmp_path / "shared-jobs"
    root.mkdir()
    settings.LABPORTAL_JOB_DIR_ROOT = str(root)
    return root


def test_a_job_writes_in_its_folder_and_the_portal_lists_and_downloads_it(
    alice: Any, bob: Any, queues: Any, tmp_path: Path, job_root: Path
) -> None:
    if not settings.CELERY_BROKER_URL.startswith("redis://"):
        require_in_ci("a Redis broker (CELERY_BROKER_URL=redis://…)")
    stack = Stack(
        env={**stack_env(tmp_path), "LABPORTAL_JOB_DIR_ROOT": str(job_root)},
        log_dir=tmp_path / "logs",
    )
    try:
        node_name = f"e2e-{uuid.uuid4().hex[:6]}"
        _token, secret = NodeToken.issue(node_name=node_name)
        ContainerImage.objects.create(reference=TEST_IMAGE)
        stack.control_worker(tmp_path / "beat-schedule")
        stack.agent(
            name=node_name,
            token=secret,
            broker=settings.CELERY_BROKER_URL,
            runtime="local",
            gpus=1,
            state_dir=tmp_path / "agent",
            extra_env={"LABPORTAL_JOB_DIR_ROOT": str(job_root)},
        )
        wait_until(
            lambda: Gpu.objects.filter(node__name=node_name, node__state=Node.State.UP).exists(),
            timeout_s=90,
            stack=stack,
            what="the agent to register",
        )
        api = api_as(alice)
        response = api.post(
            "/api/jobs/",
            {
                "image": TEST_IMAGE,
                "gpus": 1,
                "time_limit_s": 600,
                "command": ["sh", "-c", 'mkdir -p ckpt; echo "epoch 3" > ckpt/state.txt'],
            },
            format="json",
        )
        assert response.status_code == 201, response.content
        job_id = json.loads(response.content)["id"]
        wait_until(
            lambda: Job.objects.filter(pk=job_id, state__in=Job.FINAL_STATES).exists(),
            timeout_s=120,
            stack=stack,
            what="the job to end",
        )
        job = Job.objects.get(pk=job_id)
        assert job.state == Job.State.COMPLETED, (job.state, job.end_reason, job.log_tail)
    finally:
        stack.stop()
    place = f"job:{job_id}"
    top = api.get("/api/files/list/", {"place": place}).json()
    assert [(e["name"], e["kind"]) for e in top["entries"]] == [("ckpt", "folder")]
    download = api.get("/api/files/download/", {"place": place, "path": "ckpt/state.txt"})
    assert download.status_code == 200
    assert b"".join(download.streaming_content) == b"epoch 3\n"  # type: ignore[attr-defined]
    assert api_as(bob).get("/api/files/list/", {"place": place}).status_code == 404

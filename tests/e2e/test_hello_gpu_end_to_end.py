"""The guided first job on the real stack (PostgreSQL, Redis, a control worker, the web
process and an agent with the local runtime and a simulated GPU): the lab-wide Hello GPU
template, submitted as the form sends it, runs to completion and its log names its GPU."""

from __future__ import annotations

import io
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from cluster.models import Gpu, Node, NodeToken
from handbook.hello_gpu import hello_gpu_template
from jobqueue.models import Job
from jobqueue.submit import job_submit
from labportal.devstack import Stack, free_port
from tests.e2e.test_job_logs_end_to_end import IMAGE, stack  # noqa: F401
from tests.e2e.test_jobs_end_to_end import wait_until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
]


def test_the_hello_gpu_template_runs_to_completion_and_its_log_shows_the_gpu(
    stack: Stack,  # noqa: F811
    alice: Any,
    queues: Any,
    tmp_path: Path,
) -> None:
    from django.conf import settings

    node_name = f"e2e-{uuid.uuid4().hex[:6]}"
    _token, secret = NodeToken.issue(node_name=node_name)
    call_command("seed_hello_gpu", image=IMAGE, stdout=io.StringIO())
    template = hello_gpu_template()
    assert template is not None
    stack.web(free_port())
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
    fields = template.fields
    job = job_submit(
        owner=alice,
        queue=fields["queue"],
        image=fields["image"],
        command=fields["command"],
        gpus=fields["gpus"],
        time_limit_s=int(fields["time_limit_hours"] * 3600),
    )
    wait_until(
        lambda: Job.objects.get(pk=job.pk).is_final,
        timeout_s=180,
        stack=stack,
        what="the Hello GPU job to end",
    )
    job.refresh_from_db()
    assert job.state == Job.State.COMPLETED, (job.state, job.end_reason)
    assert job.exit_code == 0
    wait_until(
        lambda: "Done: the job ends with exit code 0." in Job.objects.get(pk=job.pk).log_tail,
        timeout_s=60,
        stack=stack,
        what="the job's last log line",
    )
    log = Job.objects.get(pk=job.pk).log_tail
    assert "GPUs given to this job: CUDA_VISIBLE_DEVICES=" in log, log
    assert "CUDA_VISIBLE_DEVICES=(not set)" not in log, log
    assert "CPU work, not GPU work: " in log, log

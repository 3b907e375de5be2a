"""Slurm mode: the queue page lists the jobs members submitted to Slurm directly (plain
sbatch) beside the portal's own, waiting and running (issue 29 Medium 7)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from slurm.models import SlurmJob

pytestmark = pytest.mark.django_db


@pytest.fixture
def plain_jobs(bob: Any) -> None:
    now = timezone.now()
    SlurmJob.objects.create(
        slurm_job_id=501,
        user=bob,
        partition="gpu",
        qos="normal",
        state="RUNNING",
        gpus=2,
        nodes="gpu01",
        started_at=now,
    )
    SlurmJob.objects.create(
        slurm_job_id=502,
        unix_user="lab42",
        partition="gpu",
        state="PENDING",
        reason="Priority",
        gpus=4,
    )
    SlurmJob.objects.create(slurm_job_id=503, user=bob, state="COMPLETED", ended_at=now, gpus=1)


def test_the_queue_page_lists_plain_sbatch_jobs_waiting_and_running(
    settings: Any, alice: Any, plain_jobs: None
) -> None:
    settings.LABPORTAL_EXECUTOR = "slurm"
    client = Client()
    client.force_login(alice)
    page = client.get("/jobs/queue/").content.decode()
    assert 'data-testid="outside"' in page
    assert 'data-slurm-job="501"' in page and "gpu/normal" in page and "gpu01" in page
    assert 'data-slurm-job="502"' in page and "Priority" in page and "lab42" in page
    assert 'data-slurm-job="503"' not in page  # ended
    # The page's own refresh carries them too.
    tables = client.get("/jobs/queue/", HTTP_HX_REQUEST="true").content.decode()
    assert 'data-slurm-job="502"' in tables


def test_agents_mode_shows_no_such_section(alice: Any, plain_jobs: None) -> None:
    client = Client()
    client.force_login(alice)
    assert 'data-testid="outside"' not in client.get("/jobs/queue/").content.decode()

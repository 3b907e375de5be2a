"""Slurm mode: a pending job's page shows what its Slurm priority is made of (``sprio``),
so a member sees why it waits behind others (issue 29)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from jobqueue.models import Job, Queue
from slurm.admin_commands import PriorityFactors, parse_priority_factors
from slurm.cli import SlurmUnavailable
from slurm.models import SlurmJob
from tests.factories import ContainerImageFactory


def test_sprio_lines_are_read_into_their_parts() -> None:
    text = (
        "   42|     10234|   100|   9000|     0|     0|  1134|     0\n 43|1|0|0|0|0|0|21001\nbad\n"
    )
    assert parse_priority_factors(text) == {
        42: PriorityFactors(
            priority=10234, age=100, fairshare=9000, jobsize=0, partition=0, qos=1134, nice=0
        ),
        43: PriorityFactors(
            priority=1, age=0, fairshare=0, jobsize=0, partition=0, qos=0, nice=21001
        ),
    }


@pytest.fixture
def pending(alice: Any, queues: Any) -> Job:
    job = Job.objects.create(
        owner=alice,
        queue=Queue.objects.get(name="normal"),
        image=ContainerImageFactory.create(),
        command=["true"],
        time_limit_s=60,
    )
    SlurmJob.objects.create(
        slurm_job_id=77, job=job, user=alice, unix_user="nobody", state="PENDING", reason="Priority"
    )
    return job


@pytest.mark.django_db
def test_a_pending_jobs_page_shows_its_priority_parts_and_asks_slurm_once(
    settings: Any, alice: Any, pending: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.LABPORTAL_EXECUTOR = "slurm"
    asked: list[list[int]] = []

    def factors(self: Any, job_ids: list[int]) -> dict[int, PriorityFactors]:
        asked.append(job_ids)
        return {77: PriorityFactors(1, 0, 0, 0, 0, 0, 21001)}

    monkeypatch.setattr("slurm.admin_commands.SlurmAdmin.priority_factors", factors)
    client = Client()
    client.force_login(alice)
    page = client.get(f"/jobs/{pending.pk}/").content.decode()
    assert 'data-testid="slurm-priority"' in page
    assert "Slurm priority 1" in page and "nice 21001" in page
    client.get(f"/jobs/{pending.pk}/")
    assert asked == [[77]]  # the page's polling reads the cached breakdown


@pytest.mark.django_db
def test_no_breakdown_when_slurm_cannot_be_asked_or_the_job_runs(
    settings: Any, alice: Any, pending: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.LABPORTAL_EXECUTOR = "slurm"

    def down(self: Any, job_ids: list[int]) -> dict[int, PriorityFactors]:
        raise SlurmUnavailable("Unable to contact slurm controller")

    monkeypatch.setattr("slurm.admin_commands.SlurmAdmin.priority_factors", down)
    client = Client()
    client.force_login(alice)
    response = client.get(f"/jobs/{pending.pk}/")
    assert response.status_code == 200
    assert 'data-testid="slurm-priority"' not in response.content.decode()
    SlurmJob.objects.filter(slurm_job_id=77).update(state="RUNNING")
    assert 'data-testid="slurm-priority"' not in client.get(f"/jobs/{pending.pk}/").content.decode()

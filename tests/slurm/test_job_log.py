"""A Slurm job's output file is copied into its full log, a pass at a time, once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from joblogs.selectors import latest_log, log_bytes
from slurm.models import SlurmJob
from slurm.services import slurm_job_log_sync
from tests.cluster.conftest import job_on

pytestmark = pytest.mark.django_db


def test_the_output_file_is_copied_from_where_the_log_ends_and_completed_at_the_end(
    alice: Any, tmp_path: Path
) -> None:
    job = job_on(None, alice)
    out = tmp_path / "slurm-4242.out"
    out.write_bytes(b"step 1\n")
    record = SlurmJob.objects.create(slurm_job_id=4242, job=job, output_path=str(out))

    assert slurm_job_log_sync(job_id=job.pk, record=record, final=False) == 7
    assert slurm_job_log_sync(job_id=job.pk, record=record, final=False) == 0
    with out.open("ab") as handle:
        handle.write(b"step 2\n")
    assert slurm_job_log_sync(job_id=job.pk, record=record, final=True) == 7
    log = latest_log(job)
    assert log is not None and log.complete and log.stream == "slurm-4242"
    assert b"".join(log_bytes(log)) == b"step 1\nstep 2\n"
    assert slurm_job_log_sync(job_id=job.pk, record=record, final=True) == 0


def test_an_unreadable_output_file_copies_nothing(alice: Any, tmp_path: Path) -> None:
    job = job_on(None, alice)
    record = SlurmJob.objects.create(
        slurm_job_id=4343, job=job, output_path=str(tmp_path / "missing.out")
    )
    assert slurm_job_log_sync(job_id=job.pk, record=record, final=False) == 0
    assert latest_log(job) is None

"""Slurm mode: a job's dependencies go to sbatch over the Slurm job ids."""

from __future__ import annotations

from typing import Any

import pytest

from jobqueue.errors import JobRefused
from slurm.cli import SubmitRequest, _sbatch_flags
from slurm.models import SlurmJob
from tests.jobqueue.test_submit import submit
from tests.slurm.test_services import scripted  # noqa: F401  (the fixture)

pytestmark = pytest.mark.django_db


def test_the_dependency_names_the_slurm_ids(scripted: Any, alice: Any, image: Any) -> None:  # noqa: F811
    a, b = submit(alice), submit(alice)
    submit(alice, depends_on=[b.pk, a.pk], dependency="afterany")
    ids = [a.slurm.slurm_job_id, b.slurm.slurm_job_id]
    assert scripted.submitted[-1].dependency == f"afterany:{ids[0]}:{ids[1]}"
    assert scripted.submitted[0].dependency == ""


def test_a_dependency_slurm_does_not_know_is_refused(
    scripted: Any,  # noqa: F811
    alice: Any,
    image: Any,
) -> None:
    a = submit(alice)
    SlurmJob.objects.filter(job=a).delete()
    with pytest.raises(JobRefused, match=rf"Job {a.pk} has no Slurm job id yet"):
        submit(alice, depends_on=[a.pk])


def test_sbatch_gets_the_dependency_and_kills_a_job_it_can_never_run() -> None:
    request = SubmitRequest(
        unix_user="u",
        script="#!/bin/bash\ntrue\n",
        name="n",
        output_path="o",
        workdir="w",
        time_limit_s=60,
        dependency="afterok:101:102",
    )
    flags = _sbatch_flags(request)
    assert "--dependency=afterok:101:102" in flags and "--kill-on-invalid-dep=yes" in flags

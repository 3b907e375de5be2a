"""Slurm mode: a GPU process in a Slurm job's cgroup is never taken for a stray."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from alerts.models import Kind
from tests.alerts.conftest import evaluate, proc, samples, t0  # noqa: F401 (fixtures)
from tests.alerts.test_rules import gpus_of, open_alerts

MIN = timedelta(minutes=1)


@pytest.mark.django_db
def test_a_slurm_jobs_process_is_no_stray_but_a_bare_one_is(
    cluster: Any,
    admin_user: Any,
    t0: Any,  # noqa: F811
    evaluate: Any,  # noqa: F811
) -> None:
    gpu = gpus_of(cluster)[0]
    processes = [proc(700, 1000, slurm_job_id=42), proc(701, 1000, unix_user="mallory")]
    samples(gpu, start=t0 - MIN, end=t0, processes=processes)
    evaluate(t0)
    evaluate(t0 + timedelta(seconds=30))
    assert [a.subject for a in open_alerts(Kind.STRAY_PROCESS)] == [f"gpu:{gpu.pk}:pid:701"]

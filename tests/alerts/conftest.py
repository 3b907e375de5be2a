"""Helpers for the alert tests: running jobs on GPUs, and GPU samples written as the ingest would."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from cluster.models import Gpu
from jobqueue.models import Allocation, ContainerImage, Job, Queue
from telemetry.models import GpuSample


@pytest.fixture
def t0() -> datetime:
    return timezone.now().replace(microsecond=0)


def run_job(
    owner: Any, gpus: list[Gpu], *, started: datetime, queue: str = "normal", image: Any = None
) -> Job:
    job = Job.objects.create(
        owner=owner,
        queue=Queue.objects.get(name=queue),
        image=image or ContainerImage.objects.get_or_create(reference="labportal/busybox:test")[0],
        command=["python", "train.py"],
        time_limit_s=86400,
        state=Job.State.RUNNING,
        started_at=started,
        dispatched_at=started,
        node=gpus[0].node,
        shared_slot=gpus[0].kind == Gpu.Kind.SLOT,
        gpus=len(gpus),
    )
    for gpu in gpus:
        Allocation.objects.create(job=job, gpu=gpu, allocated_at=started)
    return job


def samples(
    gpu: Gpu,
    *,
    start: datetime,
    end: datetime,
    every_s: int = 30,
    util: float = 80.0,
    mem_used_mb: int = 3,
    temp_c: float = 50.0,
    ecc: int = 0,
    xid: int = 0,
    processes: list[dict[str, Any]] | None = None,
) -> None:
    """Readings of `gpu` from `start` to `end` inclusive; the GPU's latest status follows."""
    rows = []
    ts = start
    while ts <= end:
        rows.append(
            GpuSample(
                gpu=gpu,
                ts=ts,
                util_pct=util,
                mem_used_mb=mem_used_mb,
                mem_total_mb=gpu.memory_mb,
                temp_c=temp_c,
                ecc_errors=ecc,
                xid_errors=xid,
                processes=processes or [],
            )
        )
        ts += timedelta(seconds=every_s)
    GpuSample.objects.bulk_create(rows, ignore_conflicts=True)
    newest = max(r.ts for r in rows)
    Gpu.objects.filter(pk=gpu.pk).update(sampled_at=newest, mem_used_mb=mem_used_mb, util_pct=util)


def proc(pid: int, used_mb: int, job: Job | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "pid": pid,
        "used_mb": used_mb,
        "container_id": (f"c{job.pk}" if job else None),
        "job_id": job.pk if job else None,
        **extra,
    }


@pytest.fixture
def evaluate(django_capture_on_commit_callbacks: Any) -> Any:
    """`alerts_evaluate` at a given time, after the minute rollups of the samples so far
    (as the telemetry beat keeps them), with its after-commit messages sent."""
    from alerts.services import alerts_evaluate
    from telemetry.rollups import rollups_rewind, rollups_run

    def run(now: datetime) -> Any:
        rollups_rewind(to=now - timedelta(hours=6), now=now)  # samples written out of order
        rollups_run(now=now)
        with django_capture_on_commit_callbacks(execute=True):
            return alerts_evaluate(now=now)

    return run

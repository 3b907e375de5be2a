"""What Slurm mode adds to the job queue's pages and API and to telemetry's ingest."""

from __future__ import annotations

import contextlib
from dataclasses import asdict
from typing import Any

from django.core.cache import cache
from rest_framework.fields import Field

from jobqueue.extensions import register_job_api_field, register_job_page_context
from jobqueue.models import Job
from slurm.admin_commands import PriorityFactors, SlurmAdmin
from slurm.cli import SlurmError
from slurm.models import SlurmJob
from slurm.serializers import SlurmJobSummarySerializer
from telemetry.services import register_process_job_resolver

PRIORITY_CACHE_S = 15  # the job page polls; sprio runs once per job in this window


def _job_page(job: Job) -> dict[str, Any]:
    record = SlurmJob.objects.filter(job=job).first()
    factors = None
    if record is not None and record.state == "PENDING" and record.ended_at is None:
        factors = _priority_factors(record.slurm_job_id)
    return {"slurm_job": record, "slurm_priority": factors}


def _priority_factors(slurm_job_id: int) -> PriorityFactors | None:
    """sprio's breakdown of a pending job, cached briefly; None where Slurm gives none."""
    key = f"slurm:sprio:{slurm_job_id}"
    try:
        cached = cache.get(key)
    except Exception:  # the cache is down: ask Slurm
        cached = None
    if cached is not None:
        return PriorityFactors(**cached) if cached else None
    try:
        factors = SlurmAdmin().priority_factors([slurm_job_id]).get(slurm_job_id)
    except SlurmError:
        return None  # Slurm unreachable: the page says so in its banner
    with contextlib.suppress(Exception):
        cache.set(key, asdict(factors) if factors else {}, timeout=PRIORITY_CACHE_S)
    return factors


def _api_field() -> Field[Any, Any, Any, Any]:
    # Slurm mode: Slurm's own state, reason and estimated start; null in agents mode.
    return SlurmJobSummarySerializer(read_only=True, default=None, allow_null=True)


def portal_job_for_slurm_job(slurm_job_id: int) -> int | None:
    """The portal job a Slurm job runs (None for a job submitted outside the portal)."""
    return (
        SlurmJob.objects.filter(slurm_job_id=slurm_job_id).values_list("job_id", flat=True).first()
    )


def register() -> None:
    register_job_page_context("slurm", _job_page)
    register_job_api_field("slurm", _api_field)
    register_process_job_resolver("slurm_job_id", portal_job_for_slurm_job)

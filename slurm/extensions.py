"""What Slurm mode adds to the job queue's pages and API and to telemetry's ingest."""

from __future__ import annotations

from typing import Any

from rest_framework.fields import Field

from jobqueue.extensions import register_job_api_field, register_job_page_context
from jobqueue.models import Job
from slurm.models import SlurmJob
from slurm.serializers import SlurmJobSummarySerializer
from telemetry.services import register_process_job_resolver


def _job_page(job: Job) -> dict[str, Any]:
    return {"slurm_job": SlurmJob.objects.filter(job=job).first()}


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

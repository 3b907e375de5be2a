"""Slurm mode's periodic passes: thin, safe to run twice (each is a reconciliation)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from celery import shared_task

from slurm import services


@shared_task(
    name="control.slurm_jobs_sync", time_limit=120, soft_time_limit=100, ignore_result=True
)
def slurm_jobs_sync_task() -> dict[str, Any]:
    return asdict(services.slurm_jobs_sync())


@shared_task(
    name="control.slurm_inventory_sync", time_limit=120, soft_time_limit=100, ignore_result=True
)
def slurm_inventory_sync_task() -> dict[str, Any]:
    return asdict(services.slurm_inventory_sync())

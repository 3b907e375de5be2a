"""Celery tasks of the lab's rules in Slurm mode: thin, idempotent reconciliations."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from celery import shared_task


@shared_task(
    name="control.slurm_accounting_sync", time_limit=600, soft_time_limit=540, ignore_result=True
)
def slurm_accounting_sync_task() -> dict[str, object]:
    from slurm.accounting import accounting_sync

    return accounting_sync().as_dict()


@shared_task(
    name="control.slurm_policy_sync", time_limit=240, soft_time_limit=200, ignore_result=True
)
def slurm_policy_sync_task() -> dict[str, Any]:
    from slurm.policy import slurm_policy_sync

    return asdict(slurm_policy_sync())


@shared_task(
    name="control.slurm_grants_sync", time_limit=120, soft_time_limit=100, ignore_result=True
)
def slurm_grants_sync_task() -> dict[str, Any]:
    from slurm.policy import slurm_grants_sync

    return asdict(slurm_grants_sync())


@shared_task(
    name="control.slurm_reservations_sync",
    time_limit=120,
    soft_time_limit=100,
    ignore_result=True,
)
def slurm_reservations_sync_task() -> dict[str, Any]:
    from slurm.reservations import slurm_reservations_sync

    return asdict(slurm_reservations_sync())

"""Celery beat entries of Slurm mode; settings use them instead of the portal's own passes."""

from __future__ import annotations

from datetime import timedelta


def slurm_beat_schedule(*, sync_s: int) -> dict[str, dict[str, object]]:
    return {
        "slurm-jobs-sync": {
            "task": "control.slurm_jobs_sync",
            "schedule": timedelta(seconds=sync_s),
        },
        "slurm-inventory-sync": {
            "task": "control.slurm_inventory_sync",
            "schedule": timedelta(seconds=60),
        },
    }

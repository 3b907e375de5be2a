"""Celery beat entries of Slurm mode, collected into CELERY_BEAT_SCHEDULE by the settings
in Slurm mode, where they replace the portal's own passes (scheduling/beat.py)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from slurm.rules_beat import SLURM_RULES_BEAT_SCHEDULE


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


def beat_schedule(settings: Mapping[str, Any]) -> dict[str, dict[str, object]]:
    if settings["LABPORTAL_EXECUTOR"] != "slurm":
        return {}
    return {
        **slurm_beat_schedule(sync_s=settings["LABPORTAL_SLURM_SYNC_S"]),
        **SLURM_RULES_BEAT_SCHEDULE,
    }

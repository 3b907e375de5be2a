"""Celery beat entries of LabPortal's own executor, collected into CELERY_BEAT_SCHEDULE by
the settings where the agents run the jobs (under Slurm, Slurm schedules and enforces
time limits: slurm/beat.py's sync runs instead)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any


def beat_schedule(settings: Mapping[str, Any]) -> dict[str, dict[str, object]]:
    if settings["LABPORTAL_EXECUTOR"] == "slurm":
        return {}
    return {
        "scheduling-pass": {"task": "control.scheduling_pass", "schedule": timedelta(seconds=10)},
        "time-limits": {
            "task": "control.jobs_enforce_time_limits",
            "schedule": timedelta(seconds=30),
        },
    }

"""Which executor the settings name, for every layer.

The interface is ``jobqueue.executor.Executor``; this only resolves the class from
``LABPORTAL_EXECUTOR_CLASS`` or ``LABPORTAL_EXECUTORS[LABPORTAL_EXECUTOR]``, so that
cluster/, below the job queue, can ask whether the portal schedules (and so watches
its nodes' heartbeats) without importing anything above it.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string


@cache
def _load(path: str) -> Any:
    return import_string(path)


def executor_class() -> Any:
    path = (
        settings.LABPORTAL_EXECUTOR_CLASS
        or settings.LABPORTAL_EXECUTORS[settings.LABPORTAL_EXECUTOR]
    )
    return _load(path)


def portal_schedules() -> bool:
    """True where LabPortal's engine places the jobs (its agents), False under Slurm."""
    return bool(executor_class().portal_schedules)

"""Celery beat entries of the machines, collected into CELERY_BEAT_SCHEDULE by the settings."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any


def beat_schedule(settings: Mapping[str, Any]) -> dict[str, dict[str, object]]:
    # A check more than two of these (and 5 s) after the previous one follows a time the
    # control side could not hear (docs/nodes.md, Liveness).
    return {
        "node-liveness": {
            "task": "control.nodes_check_liveness",
            "schedule": timedelta(seconds=settings["LABPORTAL_LIVENESS_CHECK_S"]),
        },
    }

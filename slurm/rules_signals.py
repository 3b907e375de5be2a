"""A booking saved or its GPUs changed, in Slurm mode: push it to Slurm after the commit."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models.signals import m2m_changed, post_save

from reservations.models import Reservation


def _sync_soon(**_kwargs: Any) -> None:
    if getattr(settings, "LABPORTAL_EXECUTOR", "agents") != "slurm":
        return
    from slurm.rules_tasks import slurm_reservations_sync_task

    # One pass reconciles every booking, so repeated signals in one transaction are harmless.
    transaction.on_commit(slurm_reservations_sync_task.delay)


def connect() -> None:
    post_save.connect(_sync_soon, sender=Reservation, dispatch_uid="slurm-booking-saved")
    m2m_changed.connect(
        _sync_soon, sender=Reservation.gpus.through, dispatch_uid="slurm-booking-gpus"
    )

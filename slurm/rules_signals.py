"""In Slurm mode, push a change to Slurm after the commit instead of waiting for the minutely
pass: a booking saved or its GPUs changed, a priority grant or an emergency decided,
withdrawn or revoked (the member may submit to the grant's QOS as soon as it is approved)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save

from jobqueue.models import EmergencyRequest, PriorityGrant
from reservations.models import Reservation


def _sync_soon(**_kwargs: Any) -> None:
    if getattr(settings, "LABPORTAL_EXECUTOR", "agents") != "slurm":
        return
    from slurm.rules_tasks import slurm_reservations_sync_task

    # One pass reconciles every booking, so repeated signals in one transaction are harmless.
    transaction.on_commit(slurm_reservations_sync_task.delay)


def _grants_soon(**_kwargs: Any) -> None:
    if getattr(settings, "LABPORTAL_EXECUTOR", "agents") != "slurm":
        return
    from slurm.rules_tasks import slurm_grants_sync_task

    # The task reconciles every grant and emergency: repeated signals are harmless.
    transaction.on_commit(slurm_grants_sync_task.delay)


def connect() -> None:
    post_save.connect(_grants_soon, sender=PriorityGrant, dispatch_uid="slurm-grant-saved")
    post_delete.connect(_grants_soon, sender=PriorityGrant, dispatch_uid="slurm-grant-deleted")
    post_save.connect(_grants_soon, sender=EmergencyRequest, dispatch_uid="slurm-emergency-saved")
    post_save.connect(_sync_soon, sender=Reservation, dispatch_uid="slurm-booking-saved")
    m2m_changed.connect(
        _sync_soon, sender=Reservation.gpus.through, dispatch_uid="slurm-booking-gpus"
    )

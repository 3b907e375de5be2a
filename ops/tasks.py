"""Periodic work of the portal itself: nightly backups and the check that they happen."""

from __future__ import annotations

import logging

from celery import shared_task
from django.utils import timezone

from ops import backups

log = logging.getLogger(__name__)


@shared_task(
    name="control.backup_nightly", time_limit=3600, soft_time_limit=3500, ignore_result=True
)
def backup_nightly_task() -> str:
    archive = backups.backup_create()
    deleted = backups.backup_prune()
    log.info("backup %s written; retention deleted %d archive(s)", archive.path, len(deleted))
    return str(archive.path)


@shared_task(
    name="control.backup_check_freshness", time_limit=120, soft_time_limit=100, ignore_result=True
)
def backup_check_freshness_task() -> int:
    return backups.backup_notify_if_stale(now=timezone.now())

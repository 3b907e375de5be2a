"""What /healthz reports: each dependency the web process needs, reached for real, and how
long ago the periodic work last ran (the last scheduling pass, the last backup)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.utils import timezone

from core.portal_app import portal_app
from jobqueue.models import SchedulerLock
from ops.backups import STALE_AFTER as BACKUP_STALE_AFTER
from ops.backups import last_backup
from scheduling.passes import LOCK_NAME
from slurm.cli import client_from_settings, slurm_answered_at

logger = logging.getLogger(__name__)

BROKER_TIMEOUT_S = 3


def _database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def _cache() -> None:
    # The login lockout counts in this cache: a cache that takes nothing locks nobody out.
    key = f"labportal:healthz:{uuid.uuid4().hex}"
    cache.set(key, "1", timeout=10)
    if cache.get(key) != "1":
        raise RuntimeError("the cache did not keep a value")
    cache.delete(key)


def _broker() -> None:
    with portal_app().connection_for_write() as broker:
        broker.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_S)


def _slurm() -> None:
    client_from_settings().partitions()


def dependency_checks() -> dict[str, Callable[[], None]]:
    """The dependencies this deployment needs, by name; Slurm only in Slurm mode."""
    checks = {"database": _database, "cache": _cache, "broker": _broker}
    if settings.LABPORTAL_EXECUTOR == "slurm":
        checks["slurm"] = _slurm
    return checks


def health_report() -> tuple[bool, dict[str, str]]:
    """(all up, each dependency's state): "ok", or "down: <kind of error>".

    The error's kind only: /healthz answers anyone, and the message may name hosts.
    The full error goes to the log.
    """
    states: dict[str, str] = {}
    for name, check in dependency_checks().items():
        try:
            check()
        except Exception as exc:  # any failure means this dependency is down
            logger.warning("healthz: %s is down: %s", name, exc)
            states[name] = f"down: {type(exc).__name__}"
        else:
            states[name] = "ok"
    return all(state == "ok" for state in states.values()), states


# Beat asks for a pass every 10 s (scheduling/beat.py) and every job's end runs one: a
# last pass older than this means beat or the control worker is not running.
PASS_STALE_AFTER = timedelta(minutes=2)
SLURM_STALE_AFTER = timedelta(minutes=2)


@dataclass(frozen=True)
class Freshness:
    """When a piece of periodic work last ran, and whether that is too long ago."""

    last: datetime | None
    stale_after: timedelta

    def as_json(self, now: datetime) -> dict[str, object]:
        age = None if self.last is None else max(0.0, (now - self.last).total_seconds())
        stale = age is None or age > self.stale_after.total_seconds()
        return {
            "state": "stale" if stale else "ok",
            "age_s": None if age is None else round(age, 1),
            "stale_after_s": int(self.stale_after.total_seconds()),
        }


def periodic_work() -> dict[str, Freshness]:
    """The periodic work this deployment runs, by name: the scheduling pass where the portal
    schedules, Slurm's last answer under Slurm, the nightly backup where backups are on."""
    work: dict[str, Freshness] = {}
    if settings.LABPORTAL_EXECUTOR != "slurm":
        last_pass = (
            SchedulerLock.objects.filter(name=LOCK_NAME)
            .values_list("last_pass_at", flat=True)
            .first()
        )
        work["scheduling_pass"] = Freshness(last_pass, PASS_STALE_AFTER)
    else:
        # Slurm's jobs are synced every LABPORTAL_SLURM_SYNC_S: a last answer older than
        # this means Slurm has been unreachable since then (and job states are stale).
        work["slurm_answered"] = Freshness(slurm_answered_at(), SLURM_STALE_AFTER)
    if settings.LABPORTAL_BACKUP_ENABLED:
        newest = last_backup()
        work["backup"] = Freshness(newest.created if newest else None, BACKUP_STALE_AFTER)
    return work


def freshness_report(now: datetime | None = None) -> tuple[bool, dict[str, dict[str, object]]]:
    """(all fresh, each piece of periodic work's state, age and limit). Read only while the
    database answers: a report that cannot be read says so."""
    now = now or timezone.now()
    try:
        work = periodic_work()
    except Exception as exc:  # the database is down: health_report says so already
        logger.warning("healthz: the periodic work's times could not be read: %s", exc)
        return False, {}
    report = {name: item.as_json(now) for name, item in work.items()}
    return all(item["state"] == "ok" for item in report.values()), report

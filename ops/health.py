"""What /healthz reports: each dependency the web process needs, reached for real."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from django.conf import settings
from django.core.cache import cache
from django.db import connection

from core.portal_app import portal_app
from slurm.cli import client_from_settings

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

"""The web tier under ASGI keeps its PostgreSQL connections bounded by its pool.

Under uvicorn each request's sync code runs in a thread of its own; with persistent
connections (CONN_MAX_AGE) every such thread left its connection open, and a lab's load
passed PostgreSQL's max_connections: pages answered 503. The web tier now takes its
connections from a pool (labportal/settings.py, "Database")."""

from __future__ import annotations

import concurrent.futures
import os
from pathlib import Path
from typing import Any

import pytest
import requests
from django.db import connection

from labportal.devstack import Stack, free_port, wait_for_port

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

POOL_MAX = 4


def _open_connections(name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [name],
        )
        return int(cursor.fetchone()[0])


def test_many_concurrent_requests_use_at_most_the_pools_connections(tmp_path: Path) -> None:
    db: dict[str, Any] = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "labportal.settings",
        "DATABASE_URL": url,
        "DATABASE_POOL_MAX": str(POOL_MAX),
        "LABPORTAL_VAR_DIR": str(tmp_path),
        "DEBUG": "false",
        "SECRET_KEY": "asgi-connections-test-" + "x" * 40,
        "ALLOWED_HOSTS": "127.0.0.1",
        "LOG_LEVEL": "ERROR",
    }
    env.pop("LABPORTAL_ASGI", None)  # labportal/asgi.py sets it, as in production
    stack = Stack(env=env, log_dir=tmp_path / "logs")
    try:
        stack.web(port, workers=1)
        wait_for_port(port, timeout_s=60)

        def hit(_: int) -> int:
            return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=30).status_code

        with concurrent.futures.ThreadPoolExecutor(16) as clients:
            codes = list(clients.map(hit, range(400)))
        assert set(codes) == {200}
        # Every request touched the database; at most the pool's connections stay open
        # (before the pool: one per request thread, 39 after 300 requests from 8 clients).
        assert 0 < _open_connections(db["NAME"]) <= POOL_MAX
        assert "Traceback" not in stack.tail("web"), stack.tail("web")
    finally:
        stack.stop()

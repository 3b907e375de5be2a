"""While the database (or the broker, or Slurm) is away: 503s that say to retry, and a
/healthz that names what is down (issue 25: HTML 500 pages, and /healthz said "ok")."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from django.db import OperationalError, connection
from django.test import Client
from django.utils import timezone
from kombu import Connection

from jobqueue.models import SchedulerLock
from labportal.devstack import Stack, free_port, wait_for_port
from ops.backups import ARCHIVE_PREFIX, ARCHIVE_SUFFIX, STAMP_FORMAT, Archive
from scheduling.passes import LOCK_NAME
from tests.conftest import api_as

pytestmark = pytest.mark.django_db


@pytest.fixture
def database_down(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every statement from now on fails as it does when the server refuses connections."""

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise OperationalError('connection to server at "127.0.0.1", port 5432 failed')

    monkeypatch.setattr(connection, "cursor", refuse)
    monkeypatch.setattr(connection, "chunked_cursor", refuse)


def test_the_api_answers_json_503_with_a_retry_hint_while_the_database_is_down(
    alice: Any, request: pytest.FixtureRequest
) -> None:
    client = api_as(alice)
    request.getfixturevalue("database_down")
    response = client.get("/api/jobs/")
    assert response.status_code == 503
    assert response["Content-Type"] == "application/json"
    assert response["Retry-After"] == "30"
    assert response.json()["code"] == "database_unavailable"
    assert "Try again in 30 seconds" in response.json()["detail"]


@pytest.mark.parametrize(
    ("language", "text"), [("en", "cannot reach its database"), ("zh-hans", "数据库")]
)
def test_a_signed_in_member_gets_a_friendly_503_page_in_their_language(
    alice: Any, request: pytest.FixtureRequest, language: str, text: str
) -> None:
    client = Client(HTTP_ACCEPT_LANGUAGE=language)
    client.force_login(alice)
    request.getfixturevalue("database_down")
    # Loading the session is the first statement: it fails outside any view.
    response = client.get("/jobs/")
    assert response.status_code == 503
    assert response["Retry-After"] == "30"
    page = response.content.decode()
    assert 'data-testid="error-page"' in page and text in page
    assert "private" in response["Cache-Control"]  # whose page it was is unknown


def test_other_errors_keep_the_500_page(alice: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise ValueError("a bug")

    monkeypatch.setattr("jobqueue.api.JobViewSet.list", broken)
    client = api_as(alice)
    client.raise_request_exception = False
    assert client.get("/api/jobs/").status_code == 500


def test_healthz_reports_each_dependency_and_is_ok_only_when_all_are_up(
    client: Client, request: pytest.FixtureRequest
) -> None:
    SchedulerLock.objects.create(
        name=LOCK_NAME, last_pass_at=timezone.now() - timedelta(seconds=30)
    )
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["checks"] == {"database": "ok", "cache": "ok", "broker": "ok"}
    assert set(body["periodic"]) == {"scheduling_pass"}  # backups are off in the tests
    assert body["periodic"]["scheduling_pass"]["state"] == "ok"
    assert body["periodic"]["scheduling_pass"]["age_s"] >= 30
    request.getfixturevalue("database_down")
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["status"] == "down"
    assert response.json()["checks"] == {
        "database": "down: OperationalError",
        "cache": "ok",
        "broker": "ok",
    }


def test_healthz_is_degraded_but_200_when_no_pass_ran_for_too_long_and_503_when_strict(
    client: Client,
) -> None:
    """Beat or the control worker stopped: the web tier still serves (a load balancer keeps
    it), and a monitor asking ?strict=1 gets 503 to page someone."""
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "degraded"
    assert response.json()["periodic"]["scheduling_pass"] == {
        "state": "stale",
        "age_s": None,
        "stale_after_s": 120,
    }
    SchedulerLock.objects.create(name=LOCK_NAME, last_pass_at=timezone.now() - timedelta(minutes=3))
    assert client.get("/healthz").json()["periodic"]["scheduling_pass"]["state"] == "stale"
    strict = client.get("/healthz?strict=1")
    assert strict.status_code == 503
    assert strict.json()["status"] == "degraded"
    SchedulerLock.objects.filter(name=LOCK_NAME).update(last_pass_at=timezone.now())
    assert client.get("/healthz?strict=1").status_code == 200


def test_healthz_reports_the_last_backups_age_where_backups_are_on(
    client: Client, settings: Any, tmp_path: Path
) -> None:
    settings.LABPORTAL_BACKUP_ENABLED = True
    settings.LABPORTAL_BACKUP_DIR = str(tmp_path)
    SchedulerLock.objects.create(name=LOCK_NAME, last_pass_at=timezone.now())
    response = client.get("/healthz?strict=1")
    assert response.status_code == 503
    assert response.json()["periodic"]["backup"]["state"] == "stale"  # none was ever made
    # An archive as backup_create names it (a real dump would wait on the test's own lock).
    made = timezone.now() - timedelta(hours=2)
    archive = tmp_path / f"{ARCHIVE_PREFIX}{made.strftime(STAMP_FORMAT)}{ARCHIVE_SUFFIX}"
    archive.write_bytes(b"archive")
    Archive(path=archive, created=made).checksum_path.write_text("0  x\n")
    response = client.get("/healthz?strict=1")
    assert response.status_code == 200, response.json()
    assert response.json()["periodic"]["backup"]["state"] == "ok"
    assert response.json()["periodic"]["backup"]["stale_after_s"] == 26 * 3600
    assert response.json()["periodic"]["backup"]["age_s"] >= 2 * 3600


def test_healthz_says_when_the_broker_is_unreachable(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = f"redis://127.0.0.1:{free_port()}/0"
    monkeypatch.setattr(
        "labportal.celery.app.connection_for_write", lambda: Connection(closed, connect_timeout=1)
    )
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["checks"]["broker"].startswith("down: ")
    assert response.json()["checks"]["database"] == "ok"


def test_healthz_checks_slurm_in_slurm_mode(client: Client, settings: Any, tmp_path: Path) -> None:
    key = tmp_path / "jwt.key"
    key.write_bytes(b"k" * 32)
    settings.LABPORTAL_EXECUTOR = "slurm"
    settings.LABPORTAL_SLURM_REST_URL = f"http://127.0.0.1:{free_port()}"
    settings.LABPORTAL_SLURM_JWT_KEY_FILE = str(key)
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["checks"]["slurm"] == "down: SlurmUnavailable"


@pytest.mark.parametrize(
    "database_url",
    [
        "postgres://postgres@127.0.0.1:{port}/labportal",
        "sqlite:///{tmp}/no-such-folder/labportal.sqlite3",
    ],
    ids=["postgresql-port-closed", "sqlite-file-unreachable"],
)
def test_a_real_web_process_without_its_database_answers_503s(
    tmp_path: Path, database_url: str
) -> None:
    env = {
        **os.environ,
        "DATABASE_URL": database_url.format(port=free_port(), tmp=tmp_path),
        "LABPORTAL_VAR_DIR": str(tmp_path / "var"),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    stack = Stack(env=env, log_dir=tmp_path / "logs")
    port = free_port()
    stack.web(port, workers=1)
    try:
        wait_for_port(port)
        base = f"http://127.0.0.1:{port}"
        api = requests.get(
            f"{base}/api/jobs/", headers={"Authorization": "Bearer lp_x"}, timeout=30
        )
        assert (api.status_code, api.headers["Retry-After"]) == (503, "30"), api.text[:300]
        assert api.json()["code"] == "database_unavailable"
        page = requests.get(f"{base}/jobs/", cookies={"sessionid": "x" * 32}, timeout=30)
        assert page.status_code == 503, page.text[:300]
        assert "cannot reach its database" in page.text
        health = requests.get(f"{base}/healthz", timeout=30)
        assert health.status_code == 503
        assert health.json()["checks"]["database"] == "down: OperationalError"
    finally:
        stack.stop()

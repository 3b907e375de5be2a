"""Celery as it is meant to run: beat a process of its own, crontabs in the lab's time zone,
a killed worker child's task requeued, and the beat container's healthcheck."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from tests.portal_process import run_portal_python

REPO = Path(__file__).resolve().parents[2]


def _portal_python(code: str, **env: str) -> str:
    """The last line ``code`` printed, run as a deployment with ``env`` would run it."""
    result = run_portal_python(code, **env)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


BACKUP_DUE = """
import django, json
django.setup()
from datetime import datetime, timezone
from celery.schedules import maybe_schedule
from django.conf import settings
from labportal.celery import app
schedule = maybe_schedule(settings.CELERY_BEAT_SCHEDULE["backup-nightly"]["schedule"], app=app)
# 19:08 UTC on 2 December is 03:08 on 3 December in Shanghai; the last backup ran at 12:00
# Shanghai time (04:00 UTC) on the 2nd. Beat reads and stores times as app.now() gives them.
now = datetime(2026, 12, 2, 19, 8, tzinfo=timezone.utc).astimezone(app.timezone)
schedule.nowfun = lambda: now
last_run = datetime(2026, 12, 2, 4, 0, tzinfo=timezone.utc).astimezone(app.timezone)
due = schedule.is_due(last_run).is_due
print(json.dumps({"due": due, "timezone": str(app.conf.timezone)}))
"""


def test_the_nightly_backup_runs_at_its_hour_in_the_labs_time_zone_not_utc() -> None:
    env = {"LABPORTAL_BACKUP_ENABLED": "true", "LABPORTAL_BACKUP_HOUR": "3"}
    shanghai = json.loads(_portal_python(BACKUP_DUE, TIME_ZONE="Asia/Shanghai", **env))
    utc = json.loads(_portal_python(BACKUP_DUE, TIME_ZONE="UTC", **env))
    assert shanghai == {"due": True, "timezone": "Asia/Shanghai"}
    assert utc == {"due": False, "timezone": "UTC"}


def test_a_task_of_a_killed_worker_child_is_requeued_with_late_acks() -> None:
    code = (
        "import django; django.setup(); from labportal.celery import app; "
        "print(app.conf.task_acks_late, app.conf.task_reject_on_worker_lost)"
    )
    assert _portal_python(code, CELERY_BROKER_URL="redis://127.0.0.1:6379/0") == "True True"
    # The demo's filesystem broker acks on receipt; a lost worker's task cannot be requeued.
    assert _portal_python(code, CELERY_BROKER_URL="filesystem://") == "False False"


def test_the_compose_file_runs_beat_once_beside_a_worker_without_beat() -> None:
    compose = (REPO / "docker-compose.yml").read_text()
    entrypoint = (REPO / "deploy/docker/entrypoint.sh").read_text()
    assert "  beat:\n    <<: *portal\n    # Celery beat" in compose
    assert 'command: ["beat"]' in compose
    worker_role = entrypoint.split("  worker)")[1].split(";;")[0]
    beat_role = entrypoint.split("  beat)")[1].split(";;")[0]
    assert "--beat" not in worker_role and "celery -A labportal worker" in worker_role
    assert "celery -A labportal beat" in beat_role and "--schedule" in beat_role


@pytest.fixture
def healthcheck(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(
        "portal_healthcheck", REPO / "deploy/docker/healthcheck.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setenv("LABPORTAL_VAR_DIR", str(tmp_path))
    return module


def test_the_beat_healthcheck_fails_until_beat_wrote_its_schedule(
    healthcheck: types.ModuleType, tmp_path: Path
) -> None:
    with pytest.raises(RuntimeError, match="has not written"):
        healthcheck.beat_ok()
    schedule = tmp_path / "celerybeat-schedule.db"  # dbm may add a suffix
    schedule.write_bytes(b"x")
    assert healthcheck.beat_ok()
    stale = time.time() - healthcheck.BEAT_STALE_S - 60
    os.utime(schedule, (stale, stale))
    with pytest.raises(RuntimeError, match="last written"):
        healthcheck.beat_ok()


def test_a_real_beat_process_writes_the_schedule_its_healthcheck_reads(
    healthcheck: types.ModuleType,
    tmp_path: Path,
) -> None:
    celery = Path(sys.executable).with_name("celery")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "labportal.settings"}
    env["LABPORTAL_VAR_DIR"] = str(tmp_path / "var")
    beat = subprocess.Popen(
        [
            str(celery),
            "-A",
            "labportal",
            "beat",
            "--schedule",
            str(tmp_path / "celerybeat-schedule"),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("celerybeat-schedule*")):
            assert beat.poll() is None, beat.stderr.read().decode() if beat.stderr else ""
            assert time.monotonic() < deadline, "beat wrote no schedule file within 60 s"
            time.sleep(0.2)
        assert healthcheck.beat_ok()
    finally:
        beat.terminate()
        beat.wait(timeout=30)

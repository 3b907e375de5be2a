"""Reading the settings creates no folder and imports no app; Django's start creates the
folders the embedded defaults use, and the beat schedule is collected at its first use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APPS_WITH_BEAT = ["accounts", "alerts", "cluster", "ops", "reports", "scheduling", "slurm"]


def _run(code: str, var: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CELERY_BROKER_URL"}}
    env.update({"LABPORTAL_VAR_DIR": str(var), "DJANGO_SETTINGS_MODULE": "labportal.settings"})
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_importing_the_settings_creates_no_folder_and_imports_no_app(tmp_path: Path) -> None:
    var = tmp_path / "var"
    out = _run(
        "import json, sys, labportal.settings\n"
        f"print(json.dumps([m for m in {APPS_WITH_BEAT!r} if m + '.beat' in sys.modules "
        "or m + '.models' in sys.modules or 'labportal.error_reporting' in sys.modules]))",
        var,
    )
    assert not var.exists()
    assert json.loads(out) == []


def test_django_start_creates_the_folders_and_the_schedule_is_collected(tmp_path: Path) -> None:
    var = tmp_path / "var"
    out = _run(
        "import django, json; django.setup()\n"
        "from django.conf import settings\n"
        "from django.db import connection; connection.ensure_connection()\n"
        "print(json.dumps(sorted(settings.CELERY_BEAT_SCHEDULE)))",
        var,
    )
    assert sorted(p.name for p in (var / "broker").iterdir()) == ["control", "out", "processed"]
    assert (var / "labportal.sqlite3").exists()
    assert "node-liveness" in json.loads(out)

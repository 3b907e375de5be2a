"""The README's production order, `migrate` then `collectstatic`, works with DEBUG=false.

`migrate` loads the URLs for its checks before `collectstatic` has written the static
manifest; a URL that looked up a hashed static name at import time failed there with
"Missing staticfiles manifest entry for 'favicon.svg'"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.e2e
def test_migrate_then_collectstatic_in_production_mode(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DEBUG": "false",
        "SECRET_KEY": "production-order-test-" + "k" * 50,
        "ALLOWED_HOSTS": "portal.example",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "LABPORTAL_VAR_DIR": str(tmp_path / "var"),
        "LABPORTAL_STATIC_ROOT": str(tmp_path / "static"),
    }
    migrated = manage("migrate", "--noinput", env=env)
    assert migrated.returncode == 0, migrated.stderr[-2000:]
    collected = manage("collectstatic", "--noinput", env=env)
    assert collected.returncode == 0, collected.stderr[-2000:]
    manifest = tmp_path / "static" / "staticfiles.json"
    assert '"favicon.svg"' in manifest.read_text()

"""Python code run in a fresh interpreter with the portal's settings: the settings are
read once per process, as a deployment reads them from its environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_portal_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "labportal.settings", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )

"""The portal image's healthcheck: the web role answers /healthz with 200 (which it does
only while the database, the cache, the broker and, in Slurm mode, Slurm answer); the
worker role answers a Celery ping on the broker."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path


def web_ok() -> bool:
    port = os.environ.get("WEB_BIND", "0.0.0.0:8000").rsplit(":", 1)[-1]
    host = (os.environ.get("ALLOWED_HOSTS") or "localhost").split(",")[0].strip()
    if host.startswith("."):
        host = host[1:]
    request = urllib.request.Request(f"http://127.0.0.1:{port}/healthz", headers={"Host": host})
    with urllib.request.urlopen(request, timeout=8) as response:
        return bool(response.status == 200)


def worker_ok() -> bool:
    result = subprocess.run(
        [
            "celery",
            "-A",
            "labportal",
            "inspect",
            "ping",
            "--timeout",
            "5",
            "--destination",
            f"control@{os.uname().nodename}",
        ],
        capture_output=True,
        timeout=9,
    )
    return result.returncode == 0


def main() -> int:
    role_file = Path("/tmp/labportal-role")
    role = role_file.read_text().strip() if role_file.exists() else "web"
    checks = {"web": web_ok, "worker": worker_ok}
    if role not in checks:
        return 0  # one-off commands have nothing to check
    try:
        return 0 if checks[role]() else 1
    except Exception as exc:  # any failure is "unhealthy", with the reason in docker inspect
        print(f"{role} unhealthy: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

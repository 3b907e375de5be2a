"""The portal image's healthcheck: the web role answers /healthz with 200 (which it does
only while the database, the cache, the broker and, in Slurm mode, Slurm answer); the
worker role answers a Celery ping on the broker; the beat role keeps its schedule file
fresh (beat writes it at least every 3 minutes while it runs)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
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


# Celery beat syncs its schedule file every 3 minutes (Scheduler.sync_every) and on each
# due entry; the portal has entries every minute. Twice the sync interval and a margin.
BEAT_STALE_S = 7 * 60


def beat_ok() -> bool:
    schedule = Path(
        os.environ.get("LABPORTAL_VAR_DIR", "/var/lib/labportal"), "celerybeat-schedule"
    )
    candidates = [p for p in schedule.parent.glob(schedule.name + "*") if p.is_file()]
    if not candidates:
        raise RuntimeError(f"beat has not written {schedule} yet")
    age = time.time() - max(p.stat().st_mtime for p in candidates)
    if age > BEAT_STALE_S:
        raise RuntimeError(f"beat's schedule file was last written {age:.0f} s ago")
    return True


def main() -> int:
    role_file = Path("/tmp/labportal-role")
    role = role_file.read_text().strip() if role_file.exists() else "web"
    checks = {"web": web_ok, "worker": worker_ok, "beat": beat_ok}
    if role not in checks:
        return 0  # one-off commands have nothing to check
    try:
        return 0 if checks[role]() else 1
    except Exception as exc:  # any failure is "unhealthy", with the reason in docker inspect
        print(f"{role} unhealthy: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

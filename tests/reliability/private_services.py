"""Private PostgreSQL and Redis servers for outage tests: started, stopped and started again.

Each lives in a temporary directory on a free port, so the machine's own servers (which
other work uses) are never touched. PostgreSQL refuses to run as root: as root, the
cluster belongs to the ``postgres`` OS user (or ``nobody``) and its commands run as them.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from labportal.devstack import free_port, wait_for_port
from tests.conftest import require_in_ci


def postgres_bin() -> Path | None:
    """The newest installed PostgreSQL's bin directory, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: p.split("/")[4])
    return Path(found[-1]).parent if found else None


def require_binaries(*, redis: bool = True) -> None:
    """Skip (fail in CI) unless initdb, pg_ctl and (with `redis`) redis-server are installed."""
    if postgres_bin() is None:
        require_in_ci("PostgreSQL's server binaries (/usr/lib/postgresql/*/bin/initdb)")
    if redis and shutil.which("redis-server") is None:
        require_in_ci("redis-server")


def _owner() -> str | None:
    """The OS user the cluster runs as when this process is root; None otherwise."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise RuntimeError("running as root, and there is no postgres or nobody user to run as")


class PrivatePostgres:
    """A PostgreSQL cluster of this test's own: `start()`, `stop()`, `start()` again."""

    def __init__(self) -> None:
        bindir = postgres_bin()
        assert bindir is not None
        self.bin = bindir
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="labportal-pg-"))
        self.data = self.dir / "data"
        self.owner = _owner()
        if self.owner is not None:
            shutil.chown(self.dir, self.owner)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/labportal"

    def _run(self, tool: str, *args: str) -> None:
        argv = [str(self.bin / tool), *args]
        if self.owner is not None:
            argv = ["runuser", "-u", self.owner, "--", *argv]
        subprocess.run(argv, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
            " -c synchronous_commit=off -c full_page_writes=off"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.dir / "log"),
            "-w",
            "start",
        )
        wait_for_port(self.port)

    def stop(self) -> None:
        """Stop at once, as a crash or a restart does: open connections break."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def create_database(self) -> None:
        subprocess.run(
            [
                str(self.bin / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "labportal",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivateRedis:
    """A Redis server of this test's own, persisting every write (so a restart loses none)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="labportal-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", str(self.dir),
                "--appendonly", "yes",
                "--appendfsync", "always",
                "--save", "",
            ],
            stdout=(self.dir / "log").open("ab"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_for_port(self.port)

    def stop(self) -> None:
        """SIGTERM: Redis stops listening at once, after flushing what it was given."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_port_closed(port: int, timeout_s: float = 30) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        except OSError:
            return
        time.sleep(0.1)
    raise TimeoutError(f"127.0.0.1:{port} still listens after {timeout_s} s")

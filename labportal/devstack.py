"""Start LabPortal's real processes as children: web, control worker, beat, agents.

Used by the demo runner, the end-to-end tests and the benchmarks, so that all
three run the same process layout as production.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Stack:
    """Child processes, stopped together with SIGTERM then SIGKILL."""

    env: dict[str, str]
    log_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(
        self, name: str, argv: list[str], extra_env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.log_dir / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            argv,
            env={**self.env, **(extra_env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def web(self, port: int, workers: int = 2) -> subprocess.Popen[bytes]:
        # ASGI, as in production (deploy/docker/entrypoint.sh): the sessions proxy needs it.
        return self.start(
            "web",
            [
                str(BIN / "uvicorn"),
                "labportal.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                str(workers),
                "--log-level",
                "warning",
            ],
        )

    def control_worker(self, schedule_file: Path, concurrency: int = 2) -> subprocess.Popen[bytes]:
        """The control worker (queue "control") and, as a process of its own, Celery beat:
        as in production (deploy/docker/entrypoint.sh), the worker can be restarted or
        scaled without stopping the periodic work, and beat never runs twice."""
        worker = self.start(
            "control",
            [
                str(BIN / "celery"),
                "-A",
                "labportal",
                "worker",
                "--queues",
                "control",
                "--concurrency",
                str(concurrency),
                "--loglevel",
                "INFO",
                "--hostname",
                "control@%h",
            ],
        )
        self.beat(schedule_file)
        return worker

    def beat(self, schedule_file: Path) -> subprocess.Popen[bytes]:
        return self.start(
            "beat",
            [
                str(BIN / "celery"),
                "-A",
                "labportal",
                "beat",
                "--loglevel",
                "INFO",
                "--schedule",
                str(schedule_file),
            ],
        )

    def agent(
        self,
        *,
        name: str,
        token: str,
        broker: str,
        runtime: str,
        gpus: int = 4,
        state_dir: Path,
        gateway: str = "",
        job_dir_root: Path | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """An agent on simulated GPUs; ``gateway`` HOST:PORT starts its gateway (sessions,
        terminals) and ``job_dir_root`` gives each job a working folder there."""
        env = {
            "LABPORTAL_NODE_NAME": name,
            "LABPORTAL_NODE_TOKEN": token,
            "LABPORTAL_BROKER_URL": broker,
            "LABPORTAL_GPU_BACKEND": "simulated",
            "LABPORTAL_SIM_GPUS": str(gpus),
            "LABPORTAL_RUNTIME": runtime,
            "LABPORTAL_AGENT_STATE_DIR": str(state_dir),
            # The local-process runtime's jobs find this environment's tools (jupyter).
            "PATH": os.pathsep.join([str(BIN), self.env.get("PATH", "/usr/bin:/bin")]),
            "LABPORTAL_HEARTBEAT_INTERVAL": "2",
            "LABPORTAL_SAMPLE_INTERVAL": "2",
            # The demo lab's volume (see seed_demo) lives under var/.
            "LABPORTAL_ALLOWED_MOUNT_ROOTS": str(state_dir.parent),
            **({"LABPORTAL_ALLOW_LOCAL_RUNTIME": "1"} if runtime == "local" else {}),
            **({"LABPORTAL_AGENT_GATEWAY_LISTEN": gateway} if gateway else {}),
            **({"LABPORTAL_JOB_DIR_ROOT": str(job_dir_root)} if job_dir_root else {}),
            **(extra_env or {}),
        }
        return self.start(f"agent-{name}", [str(BIN / "labportal-agent")], env)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with {proc.returncode}; see {self.log_dir / (name + '.log')}"
                )

    def tail(self, name: str, lines: int = 40) -> str:
        path = self.log_dir / f"{name}.log"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            if path.exists()
            else ""
        )

    def stop(self, grace_s: float = 10) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)


def wait_for_port(port: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s} s")

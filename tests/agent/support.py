"""Helpers shared by the agent's tests (fixtures live in conftest.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.gpu import SimulatedBackend
from agent.node import NodeAgent
from agent.reporter import ControlReporter
from agent.runtime import ContainerRuntime, JobSpec, JobStatus, RuntimeStartError, StartOutcome
from protocol.signing import COMMAND_TTL_S, key_from_token, sign_command, token_kid

TEST_IMAGE = os.environ.get("LABPORTAL_TEST_IMAGE", "labportal/busybox:test")
SETUP_HINT = "run `bash .ci/docker-setup.sh` to start dockerd and build the test image"


class RecordingApp:
    """Stands in for a Celery app: records ``send_task`` calls, or fails them on demand."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[Any], dict[str, Any]]] = []
        self.fail = False

    def send_task(self, name: str, args: Any = None, **options: Any) -> None:
        if self.fail:
            raise ConnectionError("broker unreachable (test)")
        self.sent.append((name, list(args or []), options))

    def args_of(self, name: str) -> list[list[Any]]:
        """The arguments sent, with each signature envelope shown as its key id (the
        token's prefix); test_tasks_and_reporter checks the signatures themselves."""
        return [
            [args[0], args[1]["kid"], *args[2:]] if isinstance(args[1], dict) else args
            for sent_name, args, _ in self.sent
            if sent_name == name
        ]

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        events = [args[2] for args in self.args_of("control.job_event")]
        return [e for e in events if kind is None or e["kind"] == kind]


def make_agent(
    runtime: ContainerRuntime, node_name: str, *, allowed_mount_roots: Sequence[str] = ()
) -> tuple[NodeAgent, RecordingApp]:
    """A node agent on ``runtime`` with one simulated GPU, reporting to a ``RecordingApp``."""
    app = RecordingApp()
    node_agent = NodeAgent(
        node=node_name,
        backend=SimulatedBackend(1, node_name=node_name),
        runtime=runtime,
        reporter=ControlReporter(app, node_name, "tok"),
        allowed_mount_roots=allowed_mount_roots,
    )
    return node_agent, app


def logs_of(runtime: ContainerRuntime, job_id: int, tail: int) -> str:
    """The log tail of a job the runtime knows (``logs()`` is ``None`` only for unknown jobs)."""
    text = runtime.logs(job_id, tail)
    assert text is not None, f"job {job_id} is unknown to the runtime"
    return text


def proc_state(pid: int) -> str | None:
    """The state letter of /proc/PID/stat ("R", "S", "Z"...), or None once the pid is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def wait_until(predicate: Callable[[], Any], timeout_s: float = 10.0, poll_s: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout_s``.

    For waiting on real processes and containers, which run on their own
    clock; it returns as soon as the condition holds.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        time.sleep(poll_s)


def job_spec(job_id: int, **overrides: Any) -> dict[str, Any]:
    """A valid ``agent.start_job`` payload for a CPU-only job."""
    spec: dict[str, Any] = {
        "job_id": job_id,
        "image": TEST_IMAGE,
        "command": ["sh", "-c", "echo hello; sleep 30"],
        "env": {"GREETING": "hi"},
        "gpu_uuids": [],
        "gpu_indices": [],
        "uid": 1234,
        "gid": 2345,
        "username": "alice",
        "cpus": 0.5,
        "memory_mb": 64,
        "pids_limit": 64,
        "mounts": [],
        "time_limit_s": 600,
    }
    spec.update(overrides)
    return spec


class FakeRuntime(ContainerRuntime):
    """An in-memory runtime: jobs run until a test ends them."""

    kind = "docker"

    def __init__(self) -> None:
        self.jobs: dict[int, JobStatus] = {}
        self.starts = 0
        self.fail_with: str | None = None
        self.logs_text = "out\n"
        self.exit_callbacks: list[Callable[[int], None]] = []

    def on_exit(self, callback: Callable[[int], None]) -> None:
        self.exit_callbacks.append(callback)

    def announce_exit(self, job_id: int) -> None:
        """What a runtime's waiter thread does when a job's process ends."""
        for callback in self.exit_callbacks:
            callback(job_id)

    def start(self, spec: JobSpec) -> StartOutcome:
        self.starts += 1
        if spec.job_id in self.jobs:
            return StartOutcome(self.jobs[spec.job_id].container_id, False, self.jobs[spec.job_id])
        if self.fail_with:
            raise RuntimeStartError(self.fail_with)
        status = JobStatus(
            job_id=spec.job_id,
            container_id=f"c{spec.job_id}",
            state="running",
            started_at=100.0,
            gpu_uuids=tuple(spec.gpu_uuids),
        )
        self.jobs[spec.job_id] = status
        return StartOutcome(status.container_id, True, status)

    def end(self, job_id: int, exit_code: int, *, oom_killed: bool = False) -> None:
        self.jobs[job_id] = replace(
            self.jobs[job_id],
            state="exited",
            exit_code=exit_code,
            finished_at=200.0,
            oom_killed=oom_killed,
        )

    def stop(self, job_id: int, grace_s: float) -> JobStatus | None:
        if job_id not in self.jobs:
            return None
        if self.jobs[job_id].running:
            self.end(job_id, 143)
        return self.jobs[job_id]

    def logs(self, job_id: int, tail: int) -> str | None:
        return self.logs_text if job_id in self.jobs else None

    def list_jobs(self) -> list[JobStatus]:
        return list(self.jobs.values())

    def job_status(self, job_id: int) -> JobStatus | None:
        return self.jobs.get(job_id)

    def remove(self, job_id: int) -> None:
        self.jobs.pop(job_id, None)


def signed(task: str, node: str, args: list[Any], *, token: str = "tok", **kw: Any) -> dict:
    """The ``auth`` the portal would attach to this command for a node holding ``token``."""
    return sign_command(
        {token_kid(token): key_from_token(token)},
        task=task,
        node=node,
        args=args,
        ttl_s=kw.get("ttl_s", COMMAND_TTL_S),
    )


def drain_queue(conn: Any, queue_name: str) -> list[tuple[str, list[Any]]]:
    """Every message waiting on ``queue_name`` now, as (task name, args), acked."""
    got: list[tuple[str, list[Any]]] = []
    with conn.SimpleQueue(queue_name) as queue:
        while True:
            try:
                message = queue.get(timeout=0.05)
            except queue.Empty:
                return got
            message.ack()
            got.append((message.headers["task"], message.payload[0]))

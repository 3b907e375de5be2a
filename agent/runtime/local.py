"""Runs jobs as plain local processes: for the demo on a machine without Docker.

This runtime isolates nothing: no cgroup limits, no mounts, no image. It only
gives each job its own process group (so a stop reaches every process the job
forked), ``CUDA_VISIBLE_DEVICES`` for its GPUs, a clean environment and a log
file. It refuses to start unless an operator enables it on purpose.

State lives under ``<state_dir>/local-jobs/<job_id>/`` so that a restarted
agent can find jobs that kept running and learn the exit code of those that
ended while it was down.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

from agent.runtime.base import (
    ContainerRuntime,
    ExecSession,
    JobSpec,
    JobStatus,
    RuntimeStartError,
    RuntimeUnavailable,
    StartOutcome,
)
from agent.runtime.job_dirs import prepare_job_dir
from agent.runtime.output import file_output_stream
from agent.runtime.pty_exec import PtyExec, process_environ

log = logging.getLogger(__name__)

ALLOW_ENV = "LABPORTAL_ALLOW_LOCAL_RUNTIME"

# The group leader is this small shell. It ignores SIGTERM with a *handler*
# (not SIG_IGN, which the job would inherit across exec), so when the group
# gets SIGTERM the job decides how to end and the shell survives to write the
# job's exit code where a restarted agent can read it. That file is opened by
# the agent and handed to the shell as its stdin (so the job's uid needs no
# access to the state directory); the job itself gets /dev/null instead.
_WRAPPER = 'trap ":" TERM INT; "$@" </dev/null; rc=$?; echo "$rc" >&0; exit "$rc"'

# Variables a job may inherit from the agent. Everything else (the node token
# above all) stays out of the job's environment.
_INHERITED_ENV = ("PATH", "LANG", "LC_ALL", "TZ")

_CLOSE_GRACE_S = 3.0
# How long kill_leftovers waits for a job's wrapper that has written its exit code to exit.
_LEADER_EXIT_WAIT_S = 2.0
_POLL_S = 0.05


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _proc_start_ticks(pid: int, *, zombie: bool = False) -> int | None:
    """The process's start time in clock ticks since boot; tells a pid from its reuse.

    A zombie counts as gone unless ``zombie`` is set: the start time of a child that
    has already exited, but that its parent has not reaped, is still its own.

    The ticks (not psutil's ``create_time``, in seconds since the epoch) are what is
    stored and compared: they never change, while the epoch time moves with the
    clock (an NTP step) and would no longer match after an agent restart.
    """
    try:
        process = psutil.Process(pid)
        status = process.status()
        if status == psutil.STATUS_DEAD or (status == psutil.STATUS_ZOMBIE and not zombie):
            return None  # a zombie has finished; it only awaits reaping
        while True:
            # create_time() is the start ticks over the clock rate plus the boot time,
            # read each call: take that boot time back off, unless the clock moved.
            boot = psutil.boot_time()
            created = process.create_time()
            if psutil.boot_time() == boot:
                return round((created - boot) * _CLOCK_TICKS)
            process = psutil.Process(pid)  # its create_time() is cached with the old boot time
    except (psutil.Error, ValueError):  # gone, or no pid (psutil refuses one below 0)
        return None


def _group_members(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` (zombies too: ``_proc_start_ticks`` drops them)."""
    members = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid:
                members.append(pid)
        except OSError:
            continue  # gone since it was listed
    return members


def _exit_code(returncode: int) -> int:
    # Popen reports death by signal N as -N; shells and Docker report 128+N.
    return 128 - returncode if returncode < 0 else returncode


class LocalProcessRuntime(ContainerRuntime):
    """Jobs as process groups on this host (demo only; see the module docstring)."""

    kind = "local"

    def __init__(self, state_dir: Path, *, enabled: bool = False) -> None:
        """Raise ``RuntimeUnavailable`` unless ``enabled`` (the operator's explicit opt-in)."""
        if not enabled:
            raise RuntimeUnavailable(
                "the local-process runtime isolates nothing and is for demos only. Enable it "
                f"on purpose with --allow-local-runtime or {ALLOW_ENV}=1, or use --runtime docker."
            )
        self._root = Path(state_dir) / "local-jobs"
        self._root.mkdir(parents=True, exist_ok=True)
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.RLock()
        self._exit_callbacks: list[Callable[[int], None]] = []
        # An ended job's status never changes while its directory stays the same one
        # (same meta.json): the watch loop lists every job the node kept, every few
        # seconds, so ended ones are not read again each time.
        self._ended: dict[int, tuple[tuple[int, int], JobStatus]] = {}

    def on_exit(self, callback: Callable[[int], None]) -> None:
        self._exit_callbacks.append(callback)

    def _wait_and_tell(self, job_id: int, proc: subprocess.Popen[bytes]) -> None:
        """A job's waiter thread: reap the wrapper the moment it ends, then tell the listeners."""
        proc.wait()
        for callback in list(self._exit_callbacks):
            try:
                callback(job_id)
            except Exception:
                log.exception("exit callback for job %s failed", job_id)

    # -- state files ---------------------------------------------------------

    def _dir(self, job_id: int) -> Path:
        return self._root / str(job_id)

    def _meta(self, job_id: int) -> dict[str, Any] | None:
        try:
            return json.loads((self._dir(job_id) / "meta.json").read_text())
        except (OSError, ValueError):
            return None

    def _alive(self, job_id: int, meta: dict[str, Any]) -> bool:
        proc = self._procs.get(job_id)
        if proc is not None:
            return proc.poll() is None
        # Not our child (the agent restarted): trust the pid only if its start
        # time matches, since the pid may since belong to something else. A job
        # whose start time was never recorded cannot be told from a reused pid.
        since = meta.get("start_ticks")
        return since is not None and _proc_start_ticks(meta["pid"]) == since

    def _meta_identity(self, job_id: int) -> tuple[int, int] | None:
        try:
            st = os.stat(f"{self._root}/{job_id}/meta.json")
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns

    def _status(self, job_id: int) -> JobStatus | None:
        with self._lock:
            known = self._ended.get(job_id)
            if known is not None:
                if known[0] == self._meta_identity(job_id):
                    return known[1]
                del self._ended[job_id]
            status = self._status_read(job_id)
            if status is not None and status.state == "exited":
                identity = self._meta_identity(job_id)
                if identity is not None:
                    self._ended[job_id] = (identity, status)
            return status

    def _status_read(self, job_id: int) -> JobStatus | None:
        with self._lock:
            meta = self._meta(job_id)
            if meta is None:
                return None
            gpus = tuple(meta.get("gpu_uuids", ()))
            ended_path = self._dir(job_id) / "ended.json"
            if ended_path.exists():
                ended = json.loads(ended_path.read_text())
                return JobStatus(
                    job_id=job_id,
                    container_id=meta["container_id"],
                    state="exited",
                    exit_code=ended["exit_code"],
                    started_at=meta["started_at"],
                    finished_at=ended["finished_at"],
                    gpu_uuids=gpus,
                    attempt=meta.get("attempt"),
                )
            if self._alive(job_id, meta):
                return JobStatus(
                    job_id=job_id,
                    container_id=meta["container_id"],
                    state="running",
                    started_at=meta["started_at"],
                    gpu_uuids=gpus,
                    attempt=meta.get("attempt"),
                )
            exit_code, finished_at = self._read_exit(job_id)
            ended = {"exit_code": exit_code, "finished_at": finished_at}
            ended_path.write_text(json.dumps(ended))
            self._procs.pop(job_id, None)
            return JobStatus(
                job_id=job_id,
                container_id=meta["container_id"],
                state="exited",
                exit_code=exit_code,
                started_at=meta["started_at"],
                finished_at=finished_at,
                gpu_uuids=gpus,
                attempt=meta.get("attempt"),
            )

    def _read_exit(self, job_id: int) -> tuple[int | None, float]:
        exit_file = self._dir(job_id) / "exit_code"
        try:
            return int(exit_file.read_text().strip()), exit_file.stat().st_mtime
        except (OSError, ValueError):
            pass
        # The wrapper died too (SIGKILL): only the parent's wait status is left,
        # and only if this agent is that parent.
        proc = self._procs.get(job_id)
        if proc is not None and proc.returncode is not None:
            return _exit_code(proc.returncode), time.time()
        return None, time.time()

    # -- the interface -------------------------------------------------------

    @staticmethod
    def _is_earlier_attempt(job_dir: Path, status: JobStatus, spec: JobSpec) -> bool:
        """A requeued job's process from before, which has ended and must not pass for it."""
        try:
            meta = json.loads((job_dir / "meta.json").read_text())
        except (OSError, ValueError):
            return False
        return int(meta.get("attempt", 0)) < spec.attempt and status.state == "exited"

    def start(self, spec: JobSpec) -> StartOutcome:
        if not spec.command:
            raise RuntimeStartError("the local runtime needs a command; it has no image default")
        if spec.session is not None:
            spec = _with_session_port(spec)
        with self._lock:
            job_dir = self._dir(spec.job_id)
            try:
                # mkdir is the claim: atomic even across agent processes.
                job_dir.mkdir()
            except FileExistsError:
                status = self._status(spec.job_id)
                if status is not None and not self._is_earlier_attempt(job_dir, status, spec):
                    return StartOutcome(status.container_id, False, status)
                shutil.rmtree(job_dir)  # a claim left by a crash mid-start
                self._ended.pop(spec.job_id, None)
                job_dir.mkdir()
            try:
                proc = self._spawn(spec, job_dir)
            except OSError as exc:
                shutil.rmtree(job_dir, ignore_errors=True)
                raise RuntimeStartError(f"could not start {spec.command[0]!r}: {exc}") from exc
            except RuntimeStartError:  # its job folder was refused
                shutil.rmtree(job_dir, ignore_errors=True)
                raise
            meta = {
                "job_id": spec.job_id,
                "pid": proc.pid,
                # The wrapper may have exited already (a job that ends at once, an agent
                # that lost the CPU): unreaped, its start time is still readable.
                "start_ticks": _proc_start_ticks(proc.pid, zombie=True),
                "started_at": time.time(),
                "container_id": f"local-{spec.job_id}-{proc.pid}",
                "gpu_uuids": spec.gpu_uuids,
                "username": spec.username,
                "attempt": spec.attempt,
                "session": _session_meta(spec),
            }
            (job_dir / "meta.json").write_text(json.dumps(meta))
            self._procs[spec.job_id] = proc
        threading.Thread(
            target=self._wait_and_tell,
            args=(spec.job_id, proc),
            name=f"local-job-{spec.job_id}-wait",
            daemon=True,
        ).start()
        status = self._status(spec.job_id)
        assert status is not None
        return StartOutcome(status.container_id, True, status)

    def _spawn(self, spec: JobSpec, job_dir: Path) -> subprocess.Popen[bytes]:
        env = {k: os.environ[k] for k in _INHERITED_ENV if k in os.environ}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        env["HOME"] = str(job_dir)
        env.update(spec.env)
        env["CUDA_VISIBLE_DEVICES"] = spec.visible_devices()
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["LABPORTAL_JOB_ID"] = str(spec.job_id)
        # With a job folder the job runs in it; its log and exit code stay in job_dir.
        cwd = prepare_job_dir(spec) if spec.job_dir else str(job_dir)
        if spec.job_dir:
            env["LABPORTAL_JOB_DIR"] = cwd
        extra: dict[str, Any] = {}
        if os.geteuid() == 0:
            # As root, at least drop to the member's uid; as anyone else the
            # job runs as the agent's user (demo).
            os.chown(job_dir, spec.uid, spec.gid)
            extra = {"user": spec.uid, "group": spec.gid, "extra_groups": []}
        exit_fd = os.open(job_dir / "exit_code", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            with open(job_dir / "output.log", "ab") as out:
                return subprocess.Popen(
                    ["/bin/sh", "-c", _WRAPPER, "labportal-job", *spec.command],
                    cwd=cwd,
                    env=env,
                    stdin=exit_fd,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # own session, so own process group: pgid == pid
                    close_fds=True,
                    **extra,
                )
        finally:
            os.close(exit_fd)

    def stop(self, job_id: int, grace_s: float) -> JobStatus | None:
        status = self._status(job_id)
        if status is None or not status.running:
            return status
        meta = self._meta(job_id)
        assert meta is not None
        pgid = meta["pid"]
        self._signal_group(job_id, meta, pgid, signal.SIGTERM)
        if not self._wait_ended(job_id, meta, grace_s):
            self._signal_group(job_id, meta, pgid, signal.SIGKILL)
            self._wait_ended(job_id, meta, 5.0)
        return self._status(job_id)

    def _signal_group(self, job_id: int, meta: dict[str, Any], pgid: int, sig: int) -> None:
        with self._lock:
            # Check liveness under the lock right before signalling: a group id
            # is only ours while our leader lives (or awaits reaping).
            if not self._alive(job_id, meta):
                return
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)

    def _wait_ended(self, job_id: int, meta: dict[str, Any], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if not self._alive(job_id, meta):
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)

    def logs(self, job_id: int, tail: int) -> str | None:
        path = self._dir(job_id) / "output.log"
        if self._meta(job_id) is None:
            return None
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 1024 * 1024))  # the tail lives in the last MiB
                data = f.read()
        except OSError:
            return ""
        lines = data.decode("utf-8", errors="replace").splitlines(keepends=True)
        return "".join(lines[-tail:]) if tail > 0 else ""

    def output_stream(self, job_id: int, offset: int) -> Iterator[bytes] | None:
        if self._meta(job_id) is None:
            return None

        def ended() -> bool:
            status = self._status(job_id)
            return status is None or status.state == "exited"

        return file_output_stream(self._dir(job_id) / "output.log", offset, ended)

    def job_status(self, job_id: int) -> JobStatus | None:
        return self._status(job_id)

    def list_jobs(self) -> list[JobStatus]:
        statuses = []
        with os.scandir(self._root) as entries:
            names = sorted(e.name for e in entries)
        for name in names:
            if name.isdigit():
                status = self._status(int(name))
                if status is not None:
                    statuses.append(status)
        return statuses

    def remove(self, job_id: int) -> None:
        status = self._status(job_id)
        if status is not None and status.running:
            self.stop(job_id, 0)
        with self._lock:
            self._procs.pop(job_id, None)
            self._ended.pop(job_id, None)
            shutil.rmtree(self._dir(job_id), ignore_errors=True)

    def kill_leftovers(self, job_id: int) -> list[int]:
        """SIGKILL what is left of an ended job's process group (a child it put in the background).

        A process is the job's only if it is in the job's process group and
        started no earlier than the job's leader: a group id cannot be reused
        while any member lives, so nothing else can match.
        """
        with self._lock:
            meta = self._meta(job_id)
            if meta is None:
                return []
            proc = self._procs.get(job_id)
            if proc is not None and proc.poll() is None and self._read_exit(job_id)[0] is not None:
                # The wrapper has written the job's exit code and is exiting: the job has
                # ended, so wait the moment it takes rather than find its leader alive.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=_LEADER_EXIT_WAIT_S)
            if self._alive(job_id, meta):
                return []
            pgid, since = meta["pid"], meta.get("start_ticks")
            if since is None:
                # No start time to tell the job's group from a later one with its id.
                return []
            killed = []
            for pid in _group_members(pgid):
                ticks = _proc_start_ticks(pid)
                if ticks is not None and ticks >= since:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
            return killed

    def close(self) -> None:
        """Stop every job still running: local processes must not outlive the demo's agent.

        Each job runs in its own process group (so a Ctrl-C to the agent does not reach
        it); without this, stopping the demo would leave the jobs' processes behind.
        """
        for status in self.list_jobs():
            if status.running:
                self.stop(status.job_id, _CLOSE_GRACE_S)

    def session_upstream(self, job_id: int) -> str | None:
        meta = self._meta(job_id)
        session = (meta or {}).get("session") or {}
        status = self._status(job_id) if session.get("kind") == "jupyter" else None
        if status is None or not status.running:
            return None
        return f"http://127.0.0.1:{int(session['port'])}"

    def exec_shell(self, job_id: int, cols: int, rows: int) -> ExecSession | None:
        status = self._status(job_id)
        meta = self._meta(job_id)
        if status is None or not status.running or meta is None:
            return None
        # The job's environment as its wrapper got it (the job may have changed its own).
        env = process_environ(meta["pid"])
        if env is None:
            return None  # ended since
        user = (os.stat(self._dir(job_id)).st_uid, os.stat(self._dir(job_id)).st_gid)
        return PtyExec(
            env=env,
            cwd=self._dir(job_id),
            cols=cols,
            rows=rows,
            user=user if os.geteuid() == 0 else None,
        )

    def job_for_pid(self, pid: int) -> JobStatus | None:
        try:
            pgid = os.getpgid(pid)
        except ProcessLookupError:
            return None
        meta_status = self._status_by_pgid(pgid)
        return meta_status

    def _status_by_pgid(self, pgid: int) -> JobStatus | None:
        for status in self.list_jobs():
            meta = self._meta(status.job_id)
            if status.running and meta is not None and meta["pid"] == pgid:
                return status
        return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _with_session_port(spec: JobSpec) -> JobSpec:
    """A session's server listens on a free port of the loopback (the contract's env)."""
    env = {
        **spec.env,
        "LABPORTAL_SESSION_HOST": "127.0.0.1",
        "LABPORTAL_SESSION_PORT": str(_free_port()),
    }
    return replace(spec, env=env)


def _session_meta(spec: JobSpec) -> dict[str, Any] | None:
    if spec.session is None:
        return None
    return {"kind": spec.session.kind, "port": int(spec.env["LABPORTAL_SESSION_PORT"])}

"""The node agent's behaviour, independent of Celery and of the CLI.

``NodeAgent`` ties a GPU backend, a container runtime and a reporter
together. The Celery tasks in ``agent.tasks`` call its ``start_job``,
``stop_job`` and ``job_logs``; ``run_loops`` is the background thread that
watches jobs, samples GPUs and sends heartbeats. Every method is safe to call
twice, because the broker may deliver a task twice.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import psutil

from agent import __version__
from agent.gpu.base import GpuBackend, GpuSample, ProcessSample
from agent.reporter import ControlReporter
from agent.runtime.base import (
    ContainerRuntime,
    JobSpec,
    JobStatus,
    RuntimeStartError,
    SpecRejected,
    device_uuid,
    device_uuids,
)
from protocol.signing import CommandVerifier, SignatureRefused

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 50
LOG_TAIL_MAX_CHARS = 8000
MAX_BUFFERED_SAMPLES = 50_000
MONITOR_ONLY_REFUSAL = "monitor_only"


def unix_user_of(pid: int) -> str | None:
    """The login name (or uid) owning host process ``pid``; ``None`` if it is gone."""
    try:
        # psutil: the name of the process's real uid, or the uid if it has no name.
        name: str = psutil.Process(pid).username()
    except (psutil.Error, ValueError):  # gone, or no pid (psutil refuses one below 0)
        return None
    return name


@dataclass(frozen=True)
class AgentTiming:
    """How often the background loop does each thing, in seconds."""

    sample_interval_s: float = 5.0
    heartbeat_interval_s: float = 5.0
    watch_interval_s: float = 2.0
    samples_per_batch: int = 6  # sampling rounds per samples_ingest message
    keep_exited_s: float = 24 * 3600.0  # then an ended, reported container is removed


class NodeAgent:
    """One node's agent: starts and stops jobs, watches them, reports to the portal.

    With ``runtime=None`` the agent is monitor-only (a Slurm node, where Slurm runs the
    jobs): it samples the GPUs and heartbeats, and refuses every job command.
    """

    def __init__(
        self,
        *,
        node: str,
        backend: GpuBackend,
        runtime: ContainerRuntime | None,
        reporter: ControlReporter,
        timing: AgentTiming | None = None,
        allowed_mount_roots: Sequence[str] = (),
        verifier: CommandVerifier | None = None,
        clock: Callable[[], float] = time.time,
        gateway_url: str | None = None,
    ) -> None:
        self.node = node
        self.backend = backend
        self.runtime = runtime
        self.reporter = reporter
        self.timing = timing or AgentTiming()
        self.allowed_mount_roots = tuple(allowed_mount_roots)
        self.verifier = verifier
        self._clock = clock
        self.gateway_url = gateway_url  # advertised in node_register (agent.gateway)
        self._lock = threading.RLock()
        self._gpu_uuids: set[str] = set()
        self._running: dict[int, JobStatus] = {}  # job id -> status, jobs running now
        self._reported_exits: set[str] = set()  # container ids whose exit was reported
        self._starting: set[int] = set()  # job ids inside start_job right now
        self._ended_while_starting: set[int] = set()
        self._stop_reasons: dict[int, str] = {}
        self._samples: list[dict[str, Any]] = []
        self._sample_rounds = 0
        self._sync_lock = threading.Lock()
        # The runtime tells us the moment a job's process ends (where it can),
        # so its exit reaches the portal now rather than at the next watch tick.
        if self.runtime is not None:
            self.runtime.on_exit(self._job_ended)

    @property
    def monitor_only(self) -> bool:
        return self.runtime is None

    @property
    def _rt(self) -> ContainerRuntime:
        """The runtime, for job work; a monitor-only agent refuses job commands before this."""
        if self.runtime is None:
            raise RuntimeError(f"node {self.node}'s agent is monitor-only: it runs no jobs")
        return self.runtime

    # -- registration and reconcile -------------------------------------------

    def node_info(self) -> dict[str, Any]:
        """The ``info`` argument of ``control.node_register``; discovers the GPUs again."""
        gpus = self.backend.discover()
        with self._lock:
            self._gpu_uuids = {g.uuid for g in gpus}
        return {
            "hostname": socket.gethostname(),
            "agent_version": __version__,
            "gpu_backend": self.backend.name,
            "runtime": self.runtime.kind if self.runtime is not None else "none",
            "monitor_only": self.monitor_only,
            "gpus": [g.as_wire() for g in gpus],
            "gateway": self.gateway_url,
        }

    def register(self) -> dict[str, Any]:
        """Send ``node_register``. Raises if the broker cannot be reached."""
        info = self.node_info()
        self.reporter.register(info)
        log.info(
            "registered node %s: %d device(s), backend %s, runtime %s",
            self.node,
            len(info["gpus"]),
            info["gpu_backend"],
            info["runtime"],
        )
        return info

    def reconcile(self) -> None:
        """Adopt the jobs found on the node at start-up.

        Running containers are re-attached; ended ones are reported as
        ``exited`` (the portal ignores the repeat if it already knew); one
        created but never started (the agent died mid-start) is removed and
        reported as ``start_failed`` so the portal can dispatch the job again.
        """
        if self.runtime is None:
            return
        for status in self.runtime.list_jobs():
            if status.state == "created":
                self.runtime.remove(status.job_id)
                self._report_start_failed(
                    status.job_id,
                    "the agent stopped before the container started; nothing ran",
                    delivery_id=status.container_id,
                )
        self._sync(at_startup=True)

    # -- tasks ------------------------------------------------------------------

    def refuse_unless_signed(self, task: str, args: list[Any], auth: Any) -> dict | None:
        """``None`` if the portal signed this command; otherwise refuse it, log and report it.

        An agent with no verifier refuses every command: it cannot tell the portal's
        messages from anyone else's on the broker.
        """
        try:
            if self.verifier is None:
                raise SignatureRefused("unsigned", "this agent has no key to check commands with")
            self.verifier.verify(task, args, auth)
        except SignatureRefused as exc:
            log.warning("refused %s: %s", task, exc)
            self.reporter.refusal(task, exc.reason, exc.detail[:500])
            return {"ok": False, "refused": exc.reason, "detail": exc.detail}
        if self.runtime is None:
            detail = (
                f"node {self.node}'s agent is monitor-only (--monitor-only): it runs no jobs, "
                "so it refuses job commands; the node's jobs are Slurm's"
            )
            log.warning("refused %s: %s", task, detail)
            self.reporter.refusal(task, MONITOR_ONLY_REFUSAL, detail)
            return {"ok": False, "refused": MONITOR_ONLY_REFUSAL, "detail": detail}
        return None

    def start_job(self, data: Mapping[str, Any], *, delivery_id: str | None = None) -> dict:
        """Start the job unless it already has a container here; report what happened.

        ``delivery_id`` (the Celery task id) makes a ``start_failed`` event
        from a redelivered message carry the same ``event_id`` as the first.
        """
        job_id = data.get("job_id") if isinstance(data, Mapping) else None
        if not isinstance(job_id, int) or isinstance(job_id, bool):
            log.error("start_job without an integer job_id: %r", data)
            return {"ok": False, "reason": "no integer job_id"}
        try:
            spec = JobSpec.from_wire(data, allowed_mount_roots=self.allowed_mount_roots)
            self._check_gpus_are_here(spec)
        except SpecRejected as exc:
            return self._report_start_failed(job_id, str(exc), delivery_id=delivery_id)

        with self._lock:
            self._starting.add(job_id)
        try:
            try:
                outcome = self._rt.start(spec)
            except RuntimeStartError as exc:
                return self._report_start_failed(job_id, str(exc), delivery_id=delivery_id)
            except Exception as exc:
                # E.g. the engine is down. Say so rather than leave the job
                # "dispatched" forever with the failure only in this log.
                log.exception("runtime error while starting job %s", job_id)
                return self._report_start_failed(
                    job_id, f"the container runtime failed: {exc}", delivery_id=delivery_id
                )
            status = outcome.status
            # Only a simulated backend acts on it: trouble to order, for the demo and tests.
            conditions = spec.env.get("LABPORTAL_SIMULATE", "")
            if conditions:
                self.backend.simulate(job_id, conditions.split(","))
            if outcome.created or status.running:
                # A repeat of "started" for a running job carries the same
                # event id, so the portal drops it if the first one arrived.
                self._adopt(status, spec.gpu_uuids)
                self.reporter.job_event(
                    self._event(job_id, "started", status.container_id, ts=status.started_at)
                )
            if outcome.created:
                log.info("job %s started in %s", job_id, status.container_id[:12])
            else:
                log.info("job %s already has %s; started nothing", job_id, status.container_id[:12])
            return {"ok": True, "container_id": status.container_id, "created": outcome.created}
        finally:
            with self._lock:
                self._starting.discard(job_id)
                ended_meanwhile = job_id in self._ended_while_starting
                self._ended_while_starting.discard(job_id)
            if ended_meanwhile:
                # The process ended before "started" went out; its exit was
                # held back so as not to overtake it. Report it now.
                self._job_ended(job_id)

    def _check_gpus_are_here(self, spec: JobSpec) -> None:
        with self._lock:
            known = set(self._gpu_uuids)
        if not known:
            known = {g.uuid for g in self.backend.discover()}
        # A shared slot (``<gpu uuid>::slot<n>``) runs on its GPU, which must be here.
        missing = [u for u in spec.gpu_uuids if device_uuid(u) not in known]
        if missing:
            raise SpecRejected(f"GPU(s) {', '.join(missing)} are not on node {self.node}")

    def stop_job(self, job_id: int, grace_s: float, reason: str) -> dict:
        """SIGTERM, wait ``grace_s``, SIGKILL; report ``exited`` with ``reason``. No-op if ended."""
        with self._lock:
            self._stop_reasons[job_id] = reason
        status = self._rt.stop(job_id, grace_s)
        if status is None:
            return {"ok": True, "found": False}
        self._sync()
        if status.state == "exited" and status.container_id not in self._reported_exits:
            # A never-started container was removed by the stop: the sync
            # cannot see it any more, so report its end here.
            self._report_exit(status)
        return {"ok": True, "found": True, "exit_code": status.exit_code}

    def job_logs(self, job_id: int, tail: int) -> str:
        """Send ``control.job_logs_report`` with the last ``tail`` lines; return the text."""
        text = self._rt.logs(job_id, tail)
        if text is None:
            text = f"[labportal-agent] no container for job {job_id} on node {self.node}\n"
        self.reporter.job_logs(job_id, text)
        return text

    # -- watching ---------------------------------------------------------------

    def _job_ended(self, job_id: int) -> None:
        """Called by the runtime from its own thread when a job's process has ended.

        Only this job is looked up (not every job the node kept), so its exit is on its
        way to the portal within milliseconds; the watch loop remains the safety net.
        """
        with self._lock:
            if job_id in self._starting:
                self._ended_while_starting.add(job_id)
                return
        try:
            with self._sync_lock:
                status = self._rt.job_status(job_id)
                if (
                    status is not None
                    and status.state == "exited"
                    and status.container_id not in self._reported_exits
                ):
                    self._report_exit(status)
        except Exception:  # the watch loop will find it; never kill the runtime's thread
            log.exception("could not report the end of job %s at once", job_id)

    def watch_once(self) -> None:
        """Report jobs that ended since the last look; adopt running ones we did not know."""
        if self.runtime is not None:
            self._sync()

    def _sync(self, *, at_startup: bool = False) -> None:
        # One sync at a time: the runtime's exit callback and the background
        # loop may both ask, and two would report the same exit twice.
        with self._sync_lock:
            self._sync_locked(at_startup=at_startup)

    def _sync_locked(self, *, at_startup: bool) -> None:
        # Snapshot what we know BEFORE listing: a job whose start completes
        # while the runtime is being listed is then either still in
        # ``starting`` or not yet in ``known_running``, so it cannot be taken
        # for a job whose container vanished.
        with self._lock:
            starting = set(self._starting)
            known_running = set(self._running)
        statuses = self._rt.list_jobs()
        with self._lock:
            starting |= self._starting  # began starting while we listed
        listed = {s.job_id for s in statuses}
        for status in statuses:
            if status.job_id in starting:
                continue  # start_job reports it; avoid "exited" overtaking "started"
            if status.running:
                with self._lock:
                    known = status.job_id in self._running
                if not known:
                    if at_startup:
                        log.info("re-attached to running job %s", status.job_id)
                    self._adopt(status, list(status.gpu_uuids))
            elif status.state == "exited" and status.container_id not in self._reported_exits:
                self._report_exit(status, at_startup=at_startup)
        with self._lock:
            # A job we knew to be running before the listing whose container
            # is not in it (removed by hand) ended without an exit code we can learn.
            vanished = [
                self._running[job_id]
                for job_id in known_running - listed - starting
                if job_id in self._running
            ]
        for status in vanished:
            self._report_exit(
                JobStatus(job_id=status.job_id, container_id=status.container_id, state="exited"),
                reason="the container disappeared (removed outside the agent)",
            )

    def _adopt(self, status: JobStatus, gpu_uuids: Sequence[str]) -> None:
        with self._lock:
            self._running[status.job_id] = status
        self.backend.attach_job(status.job_id, device_uuids(gpu_uuids), status.container_id)

    def _report_exit(
        self, status: JobStatus, *, at_startup: bool = False, reason: str | None = None
    ) -> None:
        with self._lock:
            self._running.pop(status.job_id, None)
            stop_reason = self._stop_reasons.pop(status.job_id, None)
        self.backend.detach_job(status.job_id)
        if reason is None:
            if stop_reason is not None:
                reason = f"stopped: {stop_reason}"
            elif status.oom_killed:
                reason = "killed by the kernel: out of memory (raise the job's memory)"
            elif at_startup:
                reason = "found ended when the agent started"
            else:
                reason = ""
        try:
            tail = self._rt.logs(status.job_id, LOG_TAIL_LINES) or ""
        except Exception:  # the container may be gone; the event matters more
            log.exception("could not read the log tail of job %s", status.job_id)
            tail = ""
        event = self._event(
            status.job_id,
            "exited",
            status.container_id,
            ts=status.finished_at,
            exit_code=status.exit_code,
            log_tail=tail[-LOG_TAIL_MAX_CHARS:],
            reason=reason,
        )
        self.reporter.job_event(event)
        with self._lock:
            self._reported_exits.add(status.container_id)
        log.info("job %s exited with %s (%s)", status.job_id, status.exit_code, reason or "-")

    def _report_start_failed(self, job_id: int, reason: str, *, delivery_id: str | None) -> dict:
        log.warning("job %s failed to start: %s", job_id, reason)
        event = self._event(job_id, "start_failed", None, reason=reason)
        event["event_id"] = f"{job_id}:start_failed:{delivery_id or 'none'}"
        self.reporter.job_event(event)
        return {"ok": False, "reason": reason}

    def _event(
        self,
        job_id: int,
        kind: str,
        container_id: str | None,
        *,
        ts: float | None = None,
        exit_code: int | None = None,
        log_tail: str = "",
        reason: str = "",
    ) -> dict[str, Any]:
        return {
            "event_id": f"{job_id}:{kind}:{container_id}",
            "job_id": job_id,
            "kind": kind,
            "ts": ts if ts is not None else self._clock(),
            "container_id": container_id,
            "exit_code": exit_code,
            "log_tail": log_tail,
            "reason": reason,
        }

    def cleanup_once(self, now: float | None = None) -> None:
        """Remove ended containers whose exit was reported longer than ``keep_exited_s`` ago."""
        if self.runtime is None:
            return
        now = self._clock() if now is None else now
        for status in self.runtime.list_jobs():
            if (
                status.state == "exited"
                and status.container_id in self._reported_exits
                and status.finished_at is not None
                and now - status.finished_at > self.timing.keep_exited_s
            ):
                self._rt.remove(status.job_id)
                with self._lock:
                    self._reported_exits.discard(status.container_id)

    def cleanup_ended_jobs(self, job_ids: Sequence[object]) -> dict[str, Any]:
        """Remove what the portal's ended jobs left on this node: their processes and containers.

        Only what the runtime can prove is one of these jobs' (its labelled
        container, its process group) is touched, never any other process, and
        never a job this agent is running or starting now.
        """
        wanted = {j for j in job_ids if isinstance(j, int) and not isinstance(j, bool)}
        with self._lock:
            busy = set(self._running) | set(self._starting)
        killed: list[int] = []
        removed: list[int] = []
        for status in self._rt.list_jobs():
            if status.job_id not in wanted or status.job_id in busy:
                continue
            killed += self._rt.kill_leftovers(status.job_id)
            with self._lock:
                reported = status.container_id in self._reported_exits
            if status.running or reported:
                # A container still running for an ended job, or one whose end was
                # reported: removing it ends every process inside.
                self._rt.remove(status.job_id)
                removed.append(status.job_id)
                with self._lock:
                    self._reported_exits.discard(status.container_id)
        for job_id in sorted(wanted - busy):
            self.backend.release_job(job_id)
        if killed or removed:
            log.warning(
                "cleaned up after ended jobs: killed pids %s, removed jobs %s", killed, removed
            )
        return {"killed_pids": killed, "removed_jobs": removed}

    # -- telemetry --------------------------------------------------------------

    def running_job_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._running)

    def heartbeat_once(self, now: float | None = None) -> bool:
        """Send ``node_heartbeat``, and retry job events a broker outage held back."""
        now = self._clock() if now is None else now
        self.reporter.flush_outbox()
        with self._lock:
            starting = sorted(self._starting)
        # The portal reconciles its dispatched and running jobs against these two lists.
        info: dict[str, Any] = {
            "ts": now,
            "running_job_ids": self.running_job_ids(),
            "starting_job_ids": starting,
        }
        if self.monitor_only:
            info["monitor_only"] = True
        sent = self.reporter.heartbeat(info)
        if sent and self.reporter.pending_events:
            # The broker is back: the held events go now, not when the backoff ends, since
            # this heartbeat no longer lists the jobs they end.
            self.reporter.flush_outbox(now_or_never=True)
        return sent

    def sample_once(self, now: float | None = None) -> None:
        """Take one reading of every device; send a batch every ``samples_per_batch`` rounds."""
        now = self._clock() if now is None else now
        samples = [self._attribute(s).as_wire() for s in self.backend.sample(now)]
        with self._lock:
            self._samples.extend(samples)
            # While the broker is away keep the newest readings, bounded.
            del self._samples[:-MAX_BUFFERED_SAMPLES]
            self._sample_rounds += 1
            due = self._sample_rounds >= self.timing.samples_per_batch
        if due:
            self.flush_samples()

    def flush_samples(self) -> None:
        with self._lock:
            batch, self._samples = self._samples, []
            self._sample_rounds = 0
        if batch and not self.reporter.samples(batch):
            with self._lock:
                self._samples = (batch + self._samples)[-MAX_BUFFERED_SAMPLES:]

    def _attribute(self, sample: GpuSample) -> GpuSample:
        """Fill in which job each process on the GPU belongs to."""
        with self._lock:
            by_container = {s.container_id: s.job_id for s in self._running.values()}
        processes = []
        for proc in sample.processes:
            job_id = proc.job_id
            container_id = proc.container_id
            if job_id is None and container_id is not None:
                job_id = by_container.get(container_id)
            if job_id is None and container_id is None and self.runtime is not None:
                owner = self.runtime.job_for_pid(proc.pid)
                if owner is not None:
                    job_id, container_id = owner.job_id, owner.container_id
            unix_user = proc.unix_user
            # A process in a Slurm job's cgroup is Slurm's, not a stray.
            if job_id is None and container_id is None and proc.slurm_job_id is None:
                unix_user = unix_user or unix_user_of(proc.pid)  # staff want to know whose
            processes.append(
                ProcessSample(
                    pid=proc.pid,
                    used_mb=proc.used_mb,
                    container_id=container_id,
                    job_id=job_id,
                    unix_user=unix_user,
                    slurm_job_id=proc.slurm_job_id,
                )
            )
        return replace(sample, processes=processes)

    # -- the background loop ---------------------------------------------------

    def run_loops(self, stop: threading.Event) -> None:
        """Watch, sample and heartbeat until ``stop`` is set. Never raises."""
        t = self.timing
        steps: list[tuple[float, Callable[[], Any]]] = [
            (t.watch_interval_s, self.watch_once),
            (t.sample_interval_s, self.sample_once),
            (t.heartbeat_interval_s, self.heartbeat_once),
            (max(60.0, t.watch_interval_s), self.cleanup_once),
        ]
        due = [time.monotonic()] * len(steps)
        while not stop.is_set():
            now = time.monotonic()
            for i, (interval, step) in enumerate(steps):
                if now >= due[i]:
                    try:
                        step()
                    except Exception:
                        log.exception("background step %s failed", step.__name__)
                    # Skip missed beats rather than firing them all at once.
                    due[i] = max(due[i] + interval, time.monotonic())
            stop.wait(max(0.0, min(due) - time.monotonic()))
        try:
            self.flush_samples()
        except Exception:
            log.exception("could not send the last samples")

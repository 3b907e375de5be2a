"""Runs jobs as hardened Docker containers through the ``docker`` SDK.

Every container gets only its assigned GPUs (a device request by UUID), runs
as the member's uid:gid, unprivileged with every capability dropped and
``no-new-privileges``, under pids, CPU and memory limits, with a read-only root
filesystem (a private ``/tmp`` and the spec's mounts are writable), with no
network unless the spec asks for egress (then a network of its own, never the
default bridge shared with other jobs), with only the mounts in the spec, and
carries labels that tie it to its job. Those labels are the
agent's only state: a restarted agent finds its containers by them.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, Literal

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import DeviceRequest, Mount

from agent.runtime.base import (
    LABEL_ATTEMPT,
    LABEL_GPU_UUIDS,
    LABEL_JOB_ID,
    LABEL_MANAGED,
    LABEL_NODE,
    LABEL_SESSION,
    LABEL_USER,
    ContainerRuntime,
    ExecSession,
    JobSpec,
    JobStatus,
    RuntimeStartError,
    RuntimeUnavailable,
    StartOutcome,
)
from agent.runtime.docker_exec import (
    SESSION_NETWORK,
    DockerExec,
    SessionGuardError,
    ensure_session_network,
    guard_session_bridge,
)
from agent.runtime.job_dirs import CONTAINER_JOB_DIR, job_dir_mount, prepare_job_dir
from agent.runtime.mount_paths import (
    CheckedSource,
    MountRefused,
    checked_source,
    mounts_not_as_checked,
    sources_changed_since_checked,
)
from agent.runtime.output import skip_bytes, waiting_stream

log = logging.getLogger(__name__)

_RUNNING_STATES = {"running", "paused", "restarting"}


def parse_docker_time(value: str | None) -> float | None:
    """Epoch seconds from Docker's RFC 3339 timestamps (nanoseconds, ``Z``); ``None`` if unset."""
    if not value or value.startswith("0001-"):
        return None
    head, _, rest = value.partition(".")
    if rest:
        digits = "".join(ch for ch in rest if ch.isdigit())
        tz = rest[len(digits) :]
        head = f"{head}.{digits[:6]}{tz}"
    try:
        return datetime.fromisoformat(head.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _label_int(value: str | None) -> int | None:
    """A numeric label's value; None where a container has none (made by an older agent)."""
    return int(value) if value is not None and value.isdigit() else None


def device_requests_for(gpu_uuids: list[str]) -> list[DeviceRequest]:
    """The device request that exposes exactly ``gpu_uuids``, or none for a CPU-only job.

    A request is only added when there are GPUs: an empty ``device_ids`` list
    with the nvidia driver would be rejected, and ``count=-1`` would mean *all*.
    """
    if not gpu_uuids:
        return []
    return [DeviceRequest(driver="nvidia", device_ids=list(gpu_uuids), capabilities=[["gpu"]])]


class DockerRuntime(ContainerRuntime):
    """Job containers on the local Docker engine, labelled for ``node_name``."""

    kind = "docker"
    _ncpu: int | None = None  # the engine's CPU count, read once (``_engine_cpus``)

    def __init__(
        self,
        node_name: str,
        *,
        client: docker.DockerClient | None = None,
        use_init: bool = True,
        gpu_device_requests: bool = True,
    ) -> None:
        """Connect to the engine (``DOCKER_HOST`` or the local socket) unless ``client`` is given.

        Raise ``RuntimeUnavailable`` if the engine does not answer.
        ``use_init`` runs Docker's tiny init as PID 1 so that a job that
        installs no SIGTERM handler still dies on SIGTERM instead of waiting
        out the grace period (PID 1 ignores unhandled signals).
        """
        if client is None:
            try:
                client = docker.from_env()
                client.ping()
            except DockerException as exc:
                raise RuntimeUnavailable(
                    f"cannot reach the Docker engine ({exc}). Is dockerd running, and may this "
                    "user use its socket? Set DOCKER_HOST if it listens elsewhere."
                ) from exc
        self._client = client
        self._node = node_name
        self._use_init = use_init
        self._gpu_device_requests = gpu_device_requests
        # Serialises start() within this agent; the container name (unique per
        # engine) guards against a second agent process racing this one.
        self._start_lock = threading.Lock()
        # Inspect results of exited containers never change: cache them so the
        # watcher's poll does not inspect every old container every cycle.
        self._exited: dict[str, JobStatus] = {}
        self._exit_callbacks: list[Callable[[int], None]] = []
        self._events_thread: threading.Thread | None = None
        self._events_stop = threading.Event()
        self._events_stream: Any = None

    # -- helpers -----------------------------------------------------------

    def container_name(self, job_id: int) -> str:
        return f"labportal-{self._node}-job-{job_id}"

    def network_name(self, job_id: int) -> str:
        return f"labportal-{self._node}-job-{job_id}-net"

    def _ensure_job_network(self, spec: JobSpec) -> None:
        """A bridge of the job's own: a route out, but no neighbours (inter-container off)."""
        name = self.network_name(spec.job_id)
        if self._client.networks.list(names=[name]):
            return
        self._client.networks.create(
            name,
            driver="bridge",
            labels={LABEL_MANAGED: "true", LABEL_NODE: self._node, LABEL_JOB_ID: str(spec.job_id)},
            options={"com.docker.network.bridge.enable_icc": "false"},
        )

    def _remove_job_network(self, job_id: int) -> None:
        for network in self._client.networks.list(names=[self.network_name(job_id)]):
            with contextlib.suppress(NotFound, APIError):
                network.remove()

    def _label_filters(self, job_id: int | None = None) -> dict[str, list[str]]:
        labels = [f"{LABEL_MANAGED}=true", f"{LABEL_NODE}={self._node}"]
        if job_id is not None:
            labels.append(f"{LABEL_JOB_ID}={job_id}")
        return {"label": labels}

    def _find(self, job_id: int) -> Any | None:
        found = self._client.containers.list(all=True, filters=self._label_filters(job_id))
        return found[0] if found else None

    def create_kwargs(self, spec: JobSpec, sources: list[CheckedSource]) -> dict[str, Any]:
        """The keyword arguments for ``containers.create``: the whole hardening in one place.

        ``sources`` are the spec's mounts as checked (``checked_source``): Docker
        gets their real paths, never the text the portal sent.
        """
        env = dict(spec.env)
        env.setdefault("HOME", "/tmp")
        # Set last so a job's env cannot widen its own GPU set: with the
        # toolkit's default config an unprivileged container may pick its GPUs
        # through NVIDIA_VISIBLE_DEVICES.
        visible = spec.visible_devices()
        env["NVIDIA_VISIBLE_DEVICES"] = visible if spec.gpu_uuids else "void"
        env["CUDA_VISIBLE_DEVICES"] = visible
        env["LABPORTAL_JOB_ID"] = str(spec.job_id)
        if spec.job_dir:
            env["LABPORTAL_JOB_DIR"] = CONTAINER_JOB_DIR
        kwargs: dict[str, Any] = {
            "image": spec.image,
            "command": spec.command or None,
            "name": self.container_name(spec.job_id),
            "hostname": f"job-{spec.job_id}",
            "labels": {
                LABEL_JOB_ID: str(spec.job_id),
                LABEL_NODE: self._node,
                LABEL_USER: spec.username,
                LABEL_MANAGED: "true",
                LABEL_GPU_UUIDS: ",".join(spec.gpu_uuids),
                LABEL_ATTEMPT: str(spec.attempt),
            },
            "environment": env,
            "user": f"{spec.uid}:{spec.gid}",
            "privileged": False,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges:true"],
            "pids_limit": spec.pids_limit,
            "nano_cpus": int(round(min(spec.cpus, self._engine_cpus()) * 1e9)),
            "mem_limit": f"{spec.memory_mb}m",
            # Equal to mem_limit: no swap beyond the memory limit.
            "memswap_limit": f"{spec.memory_mb}m",
            # Docker's 64 MiB /dev/shm breaks PyTorch data loaders; shm counts
            # against the memory limit anyway.
            "shm_size": f"{max(64, spec.memory_mb // 4)}m",
            "mounts": [
                Mount(
                    target=s.mount.target,
                    source=s.real_path,
                    type="bind",
                    read_only=s.mount.read_only,
                )
                for s in sources
            ],
            "init": self._use_init,
            "stop_signal": "SIGTERM",
            "read_only": True,
            # Scratch space; it counts against the memory limit like shm does.
            # Docker makes a tmpfs noexec unless told "exec": a job's $HOME must
            # run what it builds there (torch.compile's caches, say).
            "tmpfs": {"/tmp": f"rw,exec,nosuid,nodev,size={max(64, spec.memory_mb // 2)}m"},
        }
        if spec.job_dir:
            kwargs["working_dir"] = CONTAINER_JOB_DIR
        if spec.session is not None:
            # Reached only from this node, on an internal network: no route out.
            kwargs["network"] = SESSION_NETWORK
            kwargs["labels"][LABEL_SESSION] = f"{spec.session.kind}:{spec.session.port}"
            env["LABPORTAL_SESSION_HOST"] = "0.0.0.0"
            env["LABPORTAL_SESSION_PORT"] = str(spec.session.port)
        elif spec.network == "egress":
            kwargs["network"] = self.network_name(spec.job_id)
        else:
            kwargs["network_mode"] = "none"
        requests = device_requests_for(spec.device_uuids) if self._gpu_device_requests else []
        if requests:
            kwargs["device_requests"] = requests
        return kwargs

    def _engine_cpus(self) -> float:
        """The engine's CPU count: a job may ask for more CPUs than the node has (a
        queue's default on a small server), and the engine refuses a ``--cpus`` above
        it, so the job gets every CPU instead (``--cpus`` is a ceiling, not a reservation)."""
        if self._ncpu is None:
            try:
                self._ncpu = int(self._client.info().get("NCPU") or 0)
            except (
                DockerException,
                OSError,
                ValueError,
                TypeError,
            ):  # requests' errors are OSErrors
                self._ncpu = 0  # not known: the spec's CPUs go to the engine as they are
        return float(self._ncpu) if self._ncpu > 0 else float("inf")

    def _status(self, container: Any) -> JobStatus:
        attrs = container.attrs
        state = attrs.get("State") or {}
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        raw = state.get("Status", "")
        kind: Literal["created", "running", "exited"] = (
            "running" if raw in _RUNNING_STATES else "created" if raw == "created" else "exited"
        )
        gpus = labels.get(LABEL_GPU_UUIDS, "")
        return JobStatus(
            job_id=int(labels[LABEL_JOB_ID]),
            container_id=container.id,
            state=kind,
            exit_code=state.get("ExitCode") if kind == "exited" else None,
            started_at=parse_docker_time(state.get("StartedAt")),
            finished_at=parse_docker_time(state.get("FinishedAt")) if kind == "exited" else None,
            oom_killed=bool(state.get("OOMKilled")),
            gpu_uuids=tuple(u for u in gpus.split(",") if u),
            attempt=_label_int(labels.get(LABEL_ATTEMPT)),
        )

    # -- exits, as the engine reports them ----------------------------------

    def on_exit(self, callback: Callable[[int], None]) -> None:
        """Call ``callback(job_id)`` when one of this node's job containers dies.

        One thread follows the engine's event stream (``die`` events of this node's
        labelled containers), so an exit is known within milliseconds instead of at
        the agent's next look; if the stream breaks it reconnects, and the agent's
        watch loop finds whatever ended meanwhile.
        """
        self._exit_callbacks.append(callback)
        if self._events_thread is None:
            self._events_thread = threading.Thread(
                target=self._follow_events, name=f"docker-events-{self._node}", daemon=True
            )
            self._events_thread.start()

    def _follow_events(self) -> None:
        filters = {"type": "container", "event": "die", **self._label_filters()}
        pause_s = 0.5
        while not self._events_stop.is_set():
            try:
                self._events_stream = self._client.events(decode=True, filters=filters)
                pause_s = 0.5
                for event in self._events_stream:
                    labels = (event.get("Actor") or {}).get("Attributes") or {}
                    job_id = str(labels.get(LABEL_JOB_ID, ""))
                    if job_id.isdigit():
                        self._tell_exit(int(job_id))
            except Exception:
                if self._events_stop.is_set():
                    return
                log.warning("the Docker event stream broke; following it again", exc_info=True)
            self._events_stop.wait(pause_s)
            pause_s = min(pause_s * 2, 10.0)

    def _tell_exit(self, job_id: int) -> None:
        for callback in list(self._exit_callbacks):
            try:
                callback(job_id)
            except Exception:
                log.exception("exit callback for job %s failed", job_id)

    # -- the interface -----------------------------------------------------

    def start(self, spec: JobSpec) -> StartOutcome:
        with self._start_lock:
            existing = self._find(spec.job_id)
            if existing is not None and self._is_earlier_attempt(existing, spec):
                existing.remove(force=True)  # a requeued job's ended container from before
                existing = None
            if existing is not None:
                return self._existing(existing)
            # Checked just before the create. The engine mounts them at the start:
            # _refuse_unless_mounted_as_checked catches a swap in between.
            sources = [checked_source(m) for m in spec.mounts]
            job_mount = job_dir_mount(spec)
            if job_mount is not None:
                prepare_job_dir(spec)
                sources.append(checked_source(job_mount))
            kwargs = self.create_kwargs(spec, sources)
            try:
                if spec.network == "egress":
                    self._ensure_job_network(spec)
                if spec.session is not None:
                    ensure_session_network(self._client, self._node)
                    guard_session_bridge()
            except APIError as exc:
                raise RuntimeStartError(_explain(exc)) from exc
            except SessionGuardError as exc:
                raise RuntimeStartError(str(exc)) from exc
            try:
                container = self._create(kwargs)
            except APIError as exc:
                if exc.status_code == 409:  # name taken: another delivery won the race
                    existing = self._find(spec.job_id)
                    if existing is not None:
                        return self._existing(existing)
                raise RuntimeStartError(_explain(exc)) from exc
            try:
                if spec.session is not None and spec.network == "egress":
                    self._client.networks.get(self.network_name(spec.job_id)).connect(container)
                container.start()
            except APIError as exc:
                # E.g. the command does not exist in the image. Leave nothing behind.
                try:
                    container.remove(force=True)
                except DockerException:
                    log.exception("could not remove failed container %s", container.id)
                raise RuntimeStartError(_explain(exc)) from exc
            container.reload()
            if sources:
                self._refuse_unless_mounted_as_checked(container, sources)
            return StartOutcome(container.id, True, self._status(container))

    def _refuse_unless_mounted_as_checked(
        self, container: Any, sources: list[CheckedSource]
    ) -> None:
        """Remove the container if a source was swapped between its check and the mount."""
        pid = int((container.attrs.get("State") or {}).get("Pid") or 0)
        problems = mounts_not_as_checked(pid, container.id, sources)
        if problems is None:
            changed = sources_changed_since_checked(sources)
            if changed:
                log.warning(
                    "the mounts of job container %s could not be read back (it ended at once, "
                    "or this agent sees other pids than the engine), and since their check: "
                    "%s. Unless the job changed them itself, it may have seen other "
                    "directories than its mounts name",
                    container.id,
                    "; ".join(changed),
                )
            return
        if not problems:
            return
        log.warning("removing %s: its mounts are not as checked: %s", container.id, problems)
        with contextlib.suppress(NotFound):
            container.remove(force=True)
        raise MountRefused(
            "the job's mounts are not what was checked before its start, so it was stopped: "
            + "; ".join(problems)
        )

    def _is_earlier_attempt(self, container: Any, spec: JobSpec) -> bool:
        labels = (container.attrs.get("Config") or {}).get("Labels") or {}
        attempt = int(labels.get(LABEL_ATTEMPT, "0") or 0)
        return attempt < spec.attempt and self._status(container).state == "exited"

    def _existing(self, container: Any) -> StartOutcome:
        return StartOutcome(container.id, False, self._status(container))

    def _create(self, kwargs: dict[str, Any]) -> Any:
        try:
            return self._client.containers.create(**kwargs)
        except ImageNotFound:
            log.info("pulling image %s", kwargs["image"])
            try:
                self._client.images.pull(kwargs["image"])
            except DockerException as exc:
                raise RuntimeStartError(
                    f"image {kwargs['image']!r} is not on this node and could not be pulled: "
                    f"{_explain(exc)}"
                ) from exc
            return self._client.containers.create(**kwargs)

    def stop(self, job_id: int, grace_s: float) -> JobStatus | None:
        container = self._find(job_id)
        if container is None:
            return None
        status = self._status(container)
        if status.state == "created":
            # Never started: there is nothing to signal, only something to clean up.
            container.remove(force=True)
            return JobStatus(job_id=job_id, container_id=container.id, state="exited")
        if status.running:
            # The engine sends the stop signal, waits, then SIGKILLs; the SDK
            # widens its HTTP timeout by the grace period.
            container.stop(timeout=max(0, math.ceil(grace_s)))
            container.reload()
            status = self._status(container)
        return status

    def logs(self, job_id: int, tail: int) -> str | None:
        container = self._find(job_id)
        if container is None:
            return None
        raw = container.logs(stdout=True, stderr=True, tail=max(0, int(tail)))
        return raw.decode("utf-8", errors="replace")

    def output_stream(self, job_id: int, offset: int) -> Iterator[bytes] | None:
        container = self._find(job_id)
        if container is None:
            return None
        # Docker's log stream starts at the first byte: skip what was sent before.
        frames = container.logs(stdout=True, stderr=True, stream=True, follow=True)
        return skip_bytes(waiting_stream(frames), offset)

    def job_status(self, job_id: int) -> JobStatus | None:
        container = self._find(job_id)
        if container is None:
            return None
        cached = self._exited.get(container.id)
        if cached is not None:
            return cached
        status = self._status(container)
        if status.state == "exited":
            self._exited[container.id] = status
        return status

    def list_jobs(self) -> list[JobStatus]:
        statuses = []
        summaries = self._client.containers.list(
            all=True, filters=self._label_filters(), sparse=True
        )
        for summary in summaries:
            cid = summary.id
            labels = summary.attrs.get("Labels") or {}
            if summary.attrs.get("State") == "running" and LABEL_JOB_ID in labels:
                # The list summary is enough for a running container; only
                # ended ones need the inspect call for their exit code.
                gpus = labels.get(LABEL_GPU_UUIDS, "")
                statuses.append(
                    JobStatus(
                        job_id=int(labels[LABEL_JOB_ID]),
                        container_id=cid,
                        state="running",
                        gpu_uuids=tuple(u for u in gpus.split(",") if u),
                        attempt=_label_int(labels.get(LABEL_ATTEMPT)),
                    )
                )
                continue
            cached = self._exited.get(cid)
            if cached is not None:
                statuses.append(cached)
                continue
            try:
                summary.reload()
            except NotFound:
                continue  # removed between list and inspect
            status = self._status(summary)
            if status.state == "exited":
                self._exited[cid] = status
            statuses.append(status)
        return statuses

    def remove(self, job_id: int) -> None:
        container = self._find(job_id)
        if container is None:
            return
        self._exited.pop(container.id, None)
        with contextlib.suppress(NotFound):
            container.remove(force=True)
        self._remove_job_network(job_id)

    def session_upstream(self, job_id: int) -> str | None:
        container = self._find(job_id)
        if container is None or not self._status(container).running:
            return None
        kind, _, port = (container.labels.get(LABEL_SESSION) or "").partition(":")
        networks = (container.attrs.get("NetworkSettings") or {}).get("Networks") or {}
        address = (networks.get(SESSION_NETWORK) or {}).get("IPAddress")
        if kind != "jupyter" or not port.isdigit() or not address:
            return None
        return f"http://{address}:{port}"

    def exec_shell(self, job_id: int, cols: int, rows: int) -> ExecSession | None:
        container = self._find(job_id)
        if container is None or not self._status(container).running:
            return None
        user = (container.attrs.get("Config") or {}).get("User") or None
        return DockerExec(self._client.api, container.id, user=user, cols=cols, rows=rows)

    def stop_following_exits(self) -> None:
        """End the event stream's thread (``close`` does it too)."""
        self._events_stop.set()
        stream = self._events_stream
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()
        if self._events_thread is not None:
            self._events_thread.join(timeout=5)

    def close(self) -> None:
        self.stop_following_exits()
        self._client.close()


def _explain(exc: DockerException) -> str:
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc)

"""The interface every container runtime implements, and the job spec it runs.

``JobSpec.from_wire`` is the one place the portal's ``start_job`` payload is
checked: it decodes it as ``protocol.messages.StartJob`` (the message's one
definition) and then applies this node's own rules (the mount roots). A spec that
fails the check raises ``SpecRejected``; the agent turns that into a
``start_failed`` event carrying the message, so the member sees why.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Literal

from protocol import wire
from protocol.messages import Mount, SessionSpec, StartJob

LABEL_JOB_ID = "labportal.job_id"
LABEL_NODE = "labportal.node"
LABEL_USER = "labportal.user"
LABEL_MANAGED = "labportal.managed"
# Not part of the portal protocol: lets a restarted agent tell the simulated
# backend which GPUs a re-attached job holds.
LABEL_GPU_UUIDS = "labportal.gpu_uuids"
LABEL_ATTEMPT = "labportal.attempt"
# A session job's "<kind>:<port>" (protocol.messages.SessionSpec), for the gateway.
LABEL_SESSION = "labportal.session"
# The shell the gateway's exec endpoint opens in a job: bash if the image has it.
# Interactive, not a login shell: a login shell reads /etc/profile, which on Debian
# images resets PATH and would hide the image's own (conda, CUDA) from the member.
SHELL_COMMAND = [
    "/bin/sh",
    "-c",
    "if command -v bash >/dev/null 2>&1; then exec bash -i; fi; exec sh -i",
]
# A shared slot's UUID is its GPU's UUID plus this and the slot number.
SLOT_SEPARATOR = "::slot"


def device_uuid(uuid: str) -> str:
    """The physical device a schedulable UUID runs on: a slot's GPU, else the UUID itself."""
    parent, sep, number = uuid.rpartition(SLOT_SEPARATOR)
    return parent if sep and number.isdigit() else uuid


def device_uuids(uuids: Sequence[str]) -> list[str]:
    """The distinct physical devices of ``uuids``, in order."""
    return list(dict.fromkeys(device_uuid(u) for u in uuids))


class SpecRejected(Exception):
    """The start request is unsafe or malformed; nothing was started."""


class RuntimeStartError(Exception):
    """The runtime tried to start the job and failed (bad image, bad command, ...)."""


class RuntimeUnavailable(Exception):
    """The runtime cannot be used on this machine, or was not enabled."""


class ExecRefused(Exception):
    """A shell could not be opened in the job (the runtime cannot, or the engine failed)."""


class ExecSession(ABC):
    """A shell on a terminal inside a running job, for the gateway's exec endpoint.

    ``fd`` carries the terminal's bytes both ways (a pty master or the engine's
    socket); it is non-blocking. ``close`` ends the shell and what it started.
    """

    fd: int

    @abstractmethod
    def resize(self, cols: int, rows: int) -> None:
        """Set the terminal's size (the shell gets SIGWINCH)."""

    @abstractmethod
    def close(self) -> None:
        """End the shell and every process it started; safe to call twice."""


@dataclass(frozen=True)
class MountSpec:
    source: str
    target: str
    # The node's allowed mount root the source lies under (the longest that
    # matches): below it the runtime follows no symlink (see mount_paths).
    root: str
    read_only: bool = True


@dataclass(frozen=True)
class JobSpec:
    """A validated ``agent.start_job`` payload (see docs/agent.md for each field)."""

    job_id: int
    image: str
    command: list[str]
    env: dict[str, str]
    gpu_uuids: list[str]
    gpu_indices: list[int]
    uid: int
    gid: int
    username: str
    cpus: float
    memory_mb: int
    pids_limit: int
    mounts: list[MountSpec] = field(default_factory=list)
    time_limit_s: int = 0
    # Counts the portal's dispatches of this job: a requeued job comes back with a
    # higher attempt, and its ended container from before must not pass for it.
    attempt: int = 0
    # "none" (the default): the container has no network at all, so a job cannot
    # reach the broker, the database or another job. "egress": a network of its
    # own with a route out, only where the lab's admin allowed it for the queue.
    network: str = "none"
    # The job's working folder on shared storage ("" for none), checked to lie under the
    # node's --job-dir-root (job_dir_root) as <username>/<job_id>.
    job_dir: str = ""
    job_dir_root: str = ""
    # An interactive session (protocol.messages.SessionSpec): the gateway reaches it.
    session: SessionSpec | None = None

    @classmethod
    def from_wire(
        cls,
        data: Mapping[str, Any],
        *,
        allowed_mount_roots: Sequence[str] = (),
        job_dir_root: str = "",
    ) -> JobSpec:
        """Check and convert a portal payload; raise ``SpecRejected`` saying what is wrong.

        ``allowed_mount_roots`` is the node operator's own allowlist: every
        mount source must lie under one of them, whatever the portal says. With
        no roots, no mount is allowed at all.
        """
        try:
            wire_spec = wire.decode(StartJob, data)
        except wire.Refused as exc:
            raise SpecRejected(exc.detail) from None
        return cls(
            network=wire_spec.network,
            job_id=wire_spec.job_id,
            attempt=wire_spec.attempt,
            image=wire_spec.image.strip(),
            command=list(wire_spec.command),
            env=dict(wire_spec.env),
            gpu_uuids=list(wire_spec.gpu_uuids),
            gpu_indices=list(wire_spec.gpu_indices),
            uid=wire_spec.uid,
            gid=wire_spec.gid,
            username=wire_spec.username,
            cpus=wire_spec.cpus,
            memory_mb=wire_spec.memory_mb,
            pids_limit=wire_spec.pids_limit,
            mounts=[_check_mount(m, allowed_mount_roots) for m in wire_spec.mounts],
            time_limit_s=wire_spec.time_limit_s,
            job_dir=_check_job_dir(wire_spec, job_dir_root),
            job_dir_root=job_dir_root if wire_spec.job_dir else "",
            session=wire_spec.session,
        )

    def visible_devices(self) -> str:
        """The value for ``CUDA_VISIBLE_DEVICES``/``NVIDIA_VISIBLE_DEVICES``.

        UUIDs rather than indices: CUDA numbers devices fastest-first by
        default while NVML numbers them by PCI bus, so an index can name the
        wrong GPU; a UUID (``GPU-…`` or ``MIG-…``) cannot.
        """
        if self.gpu_uuids:
            return ",".join(self.device_uuids)
        return ",".join(str(i) for i in self.gpu_indices)

    @property
    def device_uuids(self) -> list[str]:
        """The GPUs the container sees: a shared slot runs on its parent GPU."""
        return device_uuids(self.gpu_uuids)


def _check_path(path: str, what: str) -> str:
    pure = PurePosixPath(path)
    if not pure.is_absolute():
        raise SpecRejected(f"mount {what} {path!r} is not an absolute path")
    if ".." in pure.parts:
        raise SpecRejected(f"mount {what} {path!r} contains '..'")
    if "\x00" in path or ":" in path or "," in path:
        # ':' and ',' would let a path smuggle options into bind syntax.
        raise SpecRejected(f"mount {what} {path!r} contains a forbidden character")
    return str(pure)


def _check_mount(mount: Mount, allowed_roots: Sequence[str]) -> MountSpec:
    source = _check_path(mount.source, "source")
    target = _check_path(mount.target, "target")
    if not allowed_roots:
        raise SpecRejected(
            f"mount source {source!r} refused: this node allows no mounts (its operator "
            "sets the roots with --allowed-mount-root)"
        )
    roots = [root for root in allowed_roots if _is_under(source, root)]
    if not roots:
        raise SpecRejected(
            f"mount source {source!r} is outside this node's allowed mount roots "
            f"({', '.join(allowed_roots)})"
        )
    root = max(roots, key=lambda r: len(PurePosixPath(r).parts))
    return MountSpec(source=source, target=target, root=root, read_only=mount.read_only)


def _check_job_dir(spec: StartJob, root: str) -> str:
    """The job folder the portal named, if it is ``<root>/<username>/<job_id>`` here."""
    if not spec.job_dir:
        return ""
    path = _check_path(spec.job_dir, "job folder")
    if not root:
        raise SpecRejected(
            f"job folder {path!r} refused: this node has no job folders (its operator sets "
            "the shared root with --job-dir-root, the portal's LABPORTAL_JOB_DIR_ROOT)"
        )
    tail = PurePosixPath(path).parts[-2:]
    if not _is_under(path, root) or tail != (spec.username, str(spec.job_id)):
        raise SpecRejected(
            f"job folder {path!r} refused: a job folder must lie under this node's "
            f"--job-dir-root {root} and end in /<username>/<job id> "
            f"(/{spec.username}/{spec.job_id})"
        )
    return path


def _is_under(path: str, root: str) -> bool:
    root_parts = PurePosixPath(root).parts
    return PurePosixPath(path).parts[: len(root_parts)] == root_parts


@dataclass(frozen=True)
class JobStatus:
    """What a runtime knows about one managed job's container or process."""

    job_id: int
    container_id: str
    state: Literal["created", "running", "exited"]
    exit_code: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    oom_killed: bool = False
    gpu_uuids: tuple[str, ...] = ()
    # Which dispatch of the job this container or process is (None: a runtime that
    # does not record it); a gateway ticket for another attempt does not open it.
    attempt: int | None = None

    @property
    def running(self) -> bool:
        return self.state == "running"


@dataclass(frozen=True)
class StartOutcome:
    """``created`` is False when the job already had a container: nothing new started."""

    container_id: str
    created: bool
    status: JobStatus


class ContainerRuntime(ABC):
    """Runs jobs in isolation on this node. Every method is safe to call twice."""

    #: Reported to the portal as ``runtime``: "docker" or "local".
    kind: str

    @abstractmethod
    def start(self, spec: JobSpec) -> StartOutcome:
        """Start the job unless it already has a container/process on this node.

        Raise ``RuntimeStartError`` when the start fails; nothing is left running.
        """

    @abstractmethod
    def stop(self, job_id: int, grace_s: float) -> JobStatus | None:
        """SIGTERM, wait up to ``grace_s``, then SIGKILL. ``None`` if the job is unknown."""

    @abstractmethod
    def logs(self, job_id: int, tail: int) -> str | None:
        """The last ``tail`` lines of output, or ``None`` if the job is unknown."""

    @abstractmethod
    def list_jobs(self) -> list[JobStatus]:
        """Every job this node's runtime manages, running or ended, not yet removed."""

    @abstractmethod
    def remove(self, job_id: int) -> None:
        """Forget an ended job and delete its container/process state."""

    def output_stream(self, job_id: int, offset: int) -> Iterator[bytes] | None:
        """The job's whole output from byte ``offset``, as it is written (``agent.logstream``).

        It yields ``b""`` while it waits for more, so a reader can send what it has, and
        ends once the job has ended and every byte was read. ``None``: unknown job, or a
        runtime that cannot stream (the agent then keeps only the end event's tail).
        """
        return None

    def job_status(self, job_id: int) -> JobStatus | None:
        """One job's status, or ``None`` if the runtime has nothing for it.

        A runtime that can look one job up directly overrides this: the agent asks it
        at each job's end, and listing every job kept for a day would cost more.
        """
        return next((s for s in self.list_jobs() if s.job_id == job_id), None)

    def job_for_pid(self, pid: int) -> JobStatus | None:
        """The job a host pid belongs to, when the runtime can tell without cgroups."""
        return None

    def on_exit(self, callback: Callable[[int], None]) -> None:
        """Call ``callback(job_id)`` from a runtime thread as soon as a job's process ends.

        Optional: a runtime that cannot tell keeps this no-op, and the agent's
        watch loop finds ended jobs by listing them.
        """
        return None

    def kill_leftovers(self, job_id: int) -> list[int]:
        """Kill processes an ended job left behind; return their pids.

        Only processes the runtime can prove are the job's (its container, its
        process group). A container's processes end with it, so by default
        there is nothing to do.
        """
        return []

    def session_upstream(self, job_id: int) -> str | None:
        """``http://host:port`` of a running session job's server, as the gateway reaches it.

        ``None`` when the job is not running, is no session, or runs no server (a
        terminal session).
        """
        return None

    def exec_shell(self, job_id: int, cols: int, rows: int) -> ExecSession | None:
        """Open ``SHELL_COMMAND`` on a terminal in a running job, as the job's user, in its
        working directory and environment; ``None`` when the job is not running.

        Raise ``ExecRefused`` when the shell cannot be opened.
        """
        raise ExecRefused(f"the {self.kind} runtime cannot open a shell in a job")

    def close(self) -> None:
        """Release connections."""
        return None

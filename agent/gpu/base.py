"""The interface every GPU backend implements, and the records it returns.

The records mirror the wire protocol (see docs/agent.md): ``GpuInfo.as_wire()``
is one entry of ``node_register``'s ``gpus`` list and ``GpuSample.as_wire()``
is one element of a ``samples_ingest`` batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal


class GpuBackendUnavailable(Exception):
    """The backend cannot run on this machine (no driver, no NVML library, ...)."""


@dataclass(frozen=True)
class GpuInfo:
    """A schedulable device: a whole GPU, or one MIG instance of a GPU.

    A MIG instance carries its parent's ``index`` and ``parent_uuid``; the
    portal schedules it under its own ``uuid``.
    """

    uuid: str
    index: int
    model: str
    memory_mb: int
    kind: Literal["gpu", "mig"] = "gpu"
    parent_uuid: str | None = None

    def as_wire(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ProcessSample:
    """One compute process seen on a device.

    ``container_id`` and ``job_id`` are filled in where the process could be
    traced to a managed container; ``None`` means "not ours" (or unknown),
    which the portal may alert on.
    """

    pid: int
    used_mb: int | None
    container_id: str | None = None
    job_id: int | None = None
    # The process's unix user, reported for processes that belong to no job.
    unix_user: str | None = None
    # In Slurm mode: the Slurm job the process runs in (from its cgroup).
    slurm_job_id: int | None = None


@dataclass(frozen=True)
class GpuSample:
    """One reading of one device. Any metric may be ``None`` when unavailable."""

    gpu_uuid: str
    ts: float
    util_pct: float | None = None
    mem_used_mb: int | None = None
    mem_total_mb: int | None = None
    temp_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: int | None = None
    ecc_errors: int | None = None
    xid_errors: int | None = None
    processes: list[ProcessSample] = field(default_factory=list)

    def as_wire(self) -> dict[str, Any]:
        wire = asdict(self)
        for process in wire["processes"]:
            if process["unix_user"] is None:  # only a stray's owner is worth the bytes
                del process["unix_user"]
            if process["slurm_job_id"] is None:  # only sent in Slurm mode
                del process["slurm_job_id"]
        return wire


class GpuBackend(ABC):
    """Discovers the node's devices and samples them.

    Implementations must be safe to call from the agent's telemetry thread
    while Celery task threads call ``attach_job``/``detach_job``.
    """

    #: Reported to the portal as ``gpu_backend``: "nvml" or "simulated".
    name: str

    @abstractmethod
    def discover(self) -> list[GpuInfo]:
        """Return every schedulable device, MIG instances included."""

    @abstractmethod
    def sample(self, now: float) -> list[GpuSample]:
        """Read every device once; ``now`` is the epoch timestamp to stamp on it."""

    def attach_job(self, job_id: int, gpu_uuids: Iterable[str], container_id: str | None) -> None:
        """Tell the backend a job now runs on these devices.

        Real hardware needs no hint, so the default does nothing; the simulated
        backend uses it to drive its dynamics and report the job's process.
        """
        return None

    def detach_job(self, job_id: int) -> None:
        """Tell the backend a job has ended. No-op unless the backend simulates."""
        return None

    def simulate(self, job_id: int, conditions: Iterable[str]) -> None:
        """Ask a simulated backend to produce conditions for a job (idle, leak, hot...). No-op on hardware."""
        return None

    def release_job(self, job_id: int) -> None:
        """The agent removed what an ended job left behind. No-op unless the backend simulates."""
        return None

    def close(self) -> None:
        """Release the library handle, if any."""
        return None

"""Map a host pid to the container it runs in, from ``/proc/<pid>/cgroup``.

NVML reports the host pids of the processes on a GPU; the cgroup path is the
cheapest reliable way back to the container (and through its labels, the job).
Formats understood, cgroup v1 and v2 alike:

- ``/docker/<id>``                                   docker, cgroupfs driver
- ``/system.slice/docker-<id>.scope``                docker, systemd driver
- ``/kubepods/.../pod<uid>/<id>``                    kubelet, cgroupfs driver
- ``/kubepods.slice/.../cri-containerd-<id>.scope``  containerd CRI, systemd driver
- ``/.../crio-<id>.scope``, ``/.../libpod-<id>.scope`` cri-o and podman

``<id>`` is the 64-hex-digit container id.

In Slurm mode the jobs are Slurm's: slurmstepd puts each job's processes under a
``job_<id>`` segment (``/slurm/uid_1000/job_42/step_0`` with cgroup v1,
``/system.slice/slurmstepd.scope/job_42/step_batch/user/task_0`` with v2), which
``slurm_job_id_from_cgroup`` reads.
"""

from __future__ import annotations

import re
from pathlib import Path

_CONTAINER_SEGMENT = re.compile(
    r"^(?:docker-|cri-containerd-|crio-|libpod-|containerd-)?(?P<id>[0-9a-f]{64})(?:\.scope)?$"
)


def container_id_from_cgroup(text: str) -> str | None:
    """Return the container id named in the contents of a ``/proc/<pid>/cgroup`` file.

    Lines are ``hierarchy-id:controllers:path``. The first path segment that
    is a container id wins: in nested setups (docker in docker) that is the
    outermost container, the one the host's engine knows. ``None`` when the
    process is not in a container.
    """
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        for segment in parts[2].split("/"):
            match = _CONTAINER_SEGMENT.match(segment)
            if match:
                return match.group("id")
    return None


_SLURM_JOB_SEGMENT = re.compile(r"^job_(?P<id>[0-9]{1,19})$")


def slurm_job_id_from_cgroup(text: str) -> int | None:
    """The Slurm job id in the contents of a ``/proc/<pid>/cgroup`` file, or ``None``."""
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        for segment in parts[2].split("/"):
            match = _SLURM_JOB_SEGMENT.match(segment)
            if match:
                return int(match.group("id"))
    return None


def slurm_job_id_for_pid(pid: int, proc_root: Path = Path("/proc")) -> int | None:
    """The Slurm job of host process ``pid``; ``None`` outside Slurm or when it is gone."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    return slurm_job_id_from_cgroup(text)


def container_id_for_pid(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """Return the container id of host process ``pid``, or ``None``.

    ``None`` also when the process is gone or unreadable: a process that ended
    between NVML's listing and this read is not an error.
    """
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    return container_id_from_cgroup(text)

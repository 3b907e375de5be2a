"""Container runtimes: hardened Docker, or plain local processes for the demo."""

from __future__ import annotations

from pathlib import Path

from agent.runtime.base import (
    ContainerRuntime,
    JobSpec,
    JobStatus,
    MountSpec,
    RuntimeStartError,
    RuntimeUnavailable,
    SpecRejected,
    StartOutcome,
)

RUNTIME_CHOICES = ("docker", "local")

__all__ = [
    "RUNTIME_CHOICES",
    "ContainerRuntime",
    "JobSpec",
    "JobStatus",
    "MountSpec",
    "RuntimeStartError",
    "RuntimeUnavailable",
    "SpecRejected",
    "StartOutcome",
    "build_runtime",
]


def build_runtime(
    choice: str,
    *,
    node_name: str,
    state_dir: Path,
    allow_local: bool = False,
    gpu_device_requests: bool = True,
) -> ContainerRuntime:
    """Build the runtime named by ``choice``; raise ``RuntimeUnavailable`` saying why not.

    ``gpu_device_requests=False`` is for simulated GPUs: their UUIDs name no device, so
    containers get the assignment in their environment and labels only.
    """
    if choice == "docker":
        from agent.runtime.docker_runtime import DockerRuntime

        return DockerRuntime(node_name, gpu_device_requests=gpu_device_requests)
    if choice == "local":
        from agent.runtime.local import LocalProcessRuntime

        return LocalProcessRuntime(state_dir, enabled=allow_local)
    raise RuntimeUnavailable(f"unknown runtime {choice!r}; choose one of {RUNTIME_CHOICES}")

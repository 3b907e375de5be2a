"""GPU backends: real NVML, or a simulation for machines without a GPU."""

from __future__ import annotations

import logging

from agent.gpu.base import GpuBackend, GpuBackendUnavailable, GpuInfo, GpuSample, ProcessSample
from agent.gpu.simulated import SimulatedBackend

log = logging.getLogger(__name__)

BACKEND_CHOICES = ("auto", "nvml", "simulated")

__all__ = [
    "BACKEND_CHOICES",
    "GpuBackend",
    "GpuBackendUnavailable",
    "GpuInfo",
    "GpuSample",
    "ProcessSample",
    "SimulatedBackend",
    "select_backend",
]


def select_backend(
    choice: str, *, node_name: str, sim_gpus: int = 2, sim_seed: int = 0
) -> GpuBackend:
    """Build the backend named by ``choice`` ("auto", "nvml" or "simulated").

    "auto" uses NVML when it initialises and falls back to the simulation
    otherwise; the backend's ``name`` is reported to the portal either way, so
    a simulated node is never mistaken for real hardware. "nvml" raises
    ``GpuBackendUnavailable`` rather than fall back.
    """
    if choice not in BACKEND_CHOICES:
        raise ValueError(f"unknown GPU backend {choice!r}; choose one of {BACKEND_CHOICES}")
    if choice in ("auto", "nvml"):
        from agent.gpu.nvml import NvmlBackend

        try:
            return NvmlBackend()
        except GpuBackendUnavailable as exc:
            if choice == "nvml":
                raise
            log.warning(
                "NVML is not available (%s); using the SIMULATED GPU backend with %d GPUs. "
                "The portal will show this node as simulated.",
                exc,
                sim_gpus,
            )
    return SimulatedBackend(sim_gpus, node_name=node_name, seed=sim_seed)

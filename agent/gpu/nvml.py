"""The real GPU backend, reading NVIDIA's management library through ``pynvml``.

Every metric read is guarded on its own: consumer cards lack ECC, MIG
instances lack utilisation, some drivers refuse power readings. A metric that
cannot be read is ``None`` in the sample; it never loses the other metrics.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from agent.gpu.base import GpuBackend, GpuBackendUnavailable, GpuInfo, GpuSample, ProcessSample
from agent.gpu.cgroup import container_id_for_pid, slurm_job_id_for_pid

log = logging.getLogger(__name__)

MIB = 1024 * 1024
T = TypeVar("T")


def _text(value: str | bytes) -> str:
    # Older nvidia-ml-py releases return bytes, newer ones str.
    return value.decode() if isinstance(value, bytes) else value


class _Device:
    """A handle plus what discovery learned about it."""

    def __init__(self, handle: Any, info: GpuInfo) -> None:
        self.handle = handle
        self.info = info


class NvmlBackend(GpuBackend):
    """Discovers and samples the node's GPUs and MIG instances through NVML."""

    name = "nvml"

    def __init__(self, *, proc_root: Path = Path("/proc"), nvml: Any = None) -> None:
        """Initialise NVML; raise ``GpuBackendUnavailable`` if it cannot start.

        ``nvml`` lets tests pass a stand-in module; by default ``pynvml`` is used.
        """
        if nvml is None:
            try:
                import pynvml
            except ImportError as exc:  # pragma: no cover - it is a hard dependency
                raise GpuBackendUnavailable(f"nvidia-ml-py is not installed: {exc}") from exc
            nvml = pynvml
        self._nvml = nvml
        self._proc_root = proc_root
        self._lock = threading.Lock()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise GpuBackendUnavailable(f"NVML did not initialise: {exc}") from exc
        self._devices: list[_Device] = []
        # XID errors since the agent started, for the devices that could
        # subscribe to them; devices that could not report None.
        self._xid_counts: dict[str, int] = {}
        self._xid_supported: set[str] = set()
        self._event_set: Any = None
        self._discover_locked()
        self._register_xid_events()

    # -- discovery ---------------------------------------------------------

    def discover(self) -> list[GpuInfo]:
        with self._lock:
            self._discover_locked()
            return [d.info for d in self._devices]

    def _discover_locked(self) -> None:
        nvml = self._nvml
        devices: list[_Device] = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            parent = GpuInfo(
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                index=index,
                model=_text(nvml.nvmlDeviceGetName(handle)),
                memory_mb=int(nvml.nvmlDeviceGetMemoryInfo(handle).total // MIB),
            )
            devices.append(_Device(handle, parent))
            devices.extend(self._mig_devices(handle, parent))
        self._devices = devices

    def _mig_devices(self, handle: Any, parent: GpuInfo) -> list[_Device]:
        nvml = self._nvml
        mode = self._try(lambda: nvml.nvmlDeviceGetMigMode(handle))
        if mode is None or mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
            return []
        found: list[_Device] = []
        count = self._try(lambda: nvml.nvmlDeviceGetMaxMigDeviceCount(handle)) or 0
        for slot in range(count):
            mig = self._try(partial(nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot))
            if mig is None:
                continue  # an empty slot answers NotFound
            memory = self._try(partial(nvml.nvmlDeviceGetMemoryInfo, mig))
            name = self._try(partial(nvml.nvmlDeviceGetName, mig))
            info = GpuInfo(
                uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
                index=parent.index,
                model=_text(name) if name else f"{parent.model} MIG",
                memory_mb=int(memory.total // MIB) if memory else 0,
                kind="mig",
                parent_uuid=parent.uuid,
            )
            found.append(_Device(mig, info))
        return found

    def _register_xid_events(self) -> None:
        """Subscribe to XID critical-error events; without support, XID stays None."""
        nvml = self._nvml
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.info("XID events unavailable: %s", exc)
            return
        for device in self._devices:
            if device.info.kind != "gpu":
                continue
            try:
                nvml.nvmlDeviceRegisterEvents(
                    device.handle, nvml.nvmlEventTypeXidCriticalError, self._event_set
                )
                self._xid_supported.add(device.info.uuid)
                self._xid_counts.setdefault(device.info.uuid, 0)
            except nvml.NVMLError as exc:
                log.info("XID events unavailable on %s: %s", device.info.uuid, exc)

    # -- sampling ----------------------------------------------------------

    def sample(self, now: float) -> list[GpuSample]:
        with self._lock:
            self._drain_xid_events()
            return [self._sample_device(d, now) for d in self._devices]

    def _drain_xid_events(self) -> None:
        """Add the XID events that arrived since the last sample to the counts."""
        nvml = self._nvml
        if self._event_set is None:
            return
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        for _ in range(1000):  # bounded: a storm of XIDs must not stall sampling
            try:
                event = wait(self._event_set, 0)
            except nvml.NVMLError:
                break  # Timeout: nothing pending
            try:
                uuid = _text(nvml.nvmlDeviceGetUUID(event.device))
            except nvml.NVMLError:
                continue
            self._xid_counts[uuid] = self._xid_counts.get(uuid, 0) + 1
            log.warning("XID %s on GPU %s", getattr(event, "eventData", "?"), uuid)

    def _sample_device(self, device: _Device, now: float) -> GpuSample:
        nvml = self._nvml
        h = device.handle
        util = self._try(lambda: nvml.nvmlDeviceGetUtilizationRates(h))
        memory = self._try(lambda: nvml.nvmlDeviceGetMemoryInfo(h))
        temp = self._try(lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))
        power_mw = self._try(lambda: nvml.nvmlDeviceGetPowerUsage(h))
        sm_clock = self._try(lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
        ecc = self._try(
            lambda: nvml.nvmlDeviceGetTotalEccErrors(
                h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            )
        )
        procs = self._try(lambda: nvml.nvmlDeviceGetComputeRunningProcesses(h)) or []
        uuid = device.info.uuid
        return GpuSample(
            gpu_uuid=uuid,
            ts=now,
            util_pct=float(util.gpu) if util is not None else None,
            mem_used_mb=int(memory.used // MIB) if memory is not None else None,
            mem_total_mb=int(memory.total // MIB) if memory is not None else None,
            temp_c=float(temp) if temp is not None else None,
            power_w=round(power_mw / 1000.0, 1) if power_mw is not None else None,
            sm_clock_mhz=int(sm_clock) if sm_clock is not None else None,
            ecc_errors=int(ecc) if ecc is not None else None,
            xid_errors=self._xid_counts[uuid] if uuid in self._xid_supported else None,
            processes=[self._process(p) for p in procs],
        )

    def _process(self, proc: Any) -> ProcessSample:
        used = getattr(proc, "usedGpuMemory", None)
        return ProcessSample(
            pid=int(proc.pid),
            # NVML reports None (or a sentinel) when it may not see the amount,
            # e.g. for another container's process without privileges.
            used_mb=int(used // MIB) if isinstance(used, int) and used < 2**63 else None,
            container_id=container_id_for_pid(int(proc.pid), self._proc_root),
            slurm_job_id=slurm_job_id_for_pid(int(proc.pid), self._proc_root),
        )

    def _try(self, read: Callable[[], T]) -> T | None:
        try:
            return read()
        except self._nvml.NVMLError:
            return None

    def close(self) -> None:
        nvml = self._nvml
        with self._lock:
            if self._event_set is not None:
                self._try(lambda: nvml.nvmlEventSetFree(self._event_set))
                self._event_set = None
            self._try(nvml.nvmlShutdown)

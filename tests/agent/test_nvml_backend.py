"""The NVML backend: its logic against a stand-in library, then the real one (marker nvml)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypedDict

import pytest

from agent.gpu.nvml import MIB, NvmlBackend

CID = "ab" * 32


class FakeDevice(TypedDict):
    uuid: str
    name: str | bytes  # older pynvml returns bytes
    total: int


class FakeNvml:
    """Just enough of ``pynvml``: GPU 0 is whole, GPU 1 has MIG on with two instances."""

    class NVMLError(Exception):
        pass

    NVML_DEVICE_MIG_ENABLE = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8

    def __init__(self) -> None:
        self.shut_down = False
        self.xid_queue: list[Any] = []
        self.devices: dict[str, FakeDevice] = {
            "g0": {"uuid": "GPU-0", "name": "NVIDIA H100 80GB HBM3", "total": 80 * 1024 * MIB},
            "g1": {"uuid": "GPU-1", "name": b"NVIDIA A100-SXM4-40GB", "total": 40 * 1024 * MIB},
            "m0": {
                "uuid": "MIG-a",
                "name": "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
                "total": 20 * 1024 * MIB,
            },
            "m1": {
                "uuid": "MIG-b",
                "name": "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
                "total": 20 * 1024 * MIB,
            },
        }

    def _fail(self, what: str) -> None:
        raise self.NVMLError(f"{what}: Not Supported")

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"g{i}"

    def nvmlDeviceGetUUID(self, h: str) -> str:
        return self.devices[h]["uuid"]

    def nvmlDeviceGetName(self, h: str) -> str | bytes:
        return self.devices[h]["name"]

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        total = self.devices[h]["total"]
        return SimpleNamespace(total=total, used=total // 4, free=total - total // 4)

    def nvmlDeviceGetMigMode(self, h: str) -> tuple[int, int]:
        if h == "g0":
            self._fail("mig mode")
        return (1, 1) if h == "g1" else (0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: str) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: str, i: int) -> str:
        if i > 1:
            raise self.NVMLError("Not Found")
        return f"m{i}"

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        if h.startswith("m"):
            self._fail("utilisation")  # MIG instances have none
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        if h.startswith("m"):
            self._fail("temperature")
        return 64

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        if h == "g1":
            self._fail("power")
        return 312_456  # milliwatts

    def nvmlDeviceGetClockInfo(self, h: str, clock: int) -> int:
        return 1980

    def nvmlDeviceGetTotalEccErrors(self, h: str, kind: int, counter: int) -> int:
        if h == "g0":
            return 2
        self._fail("ecc")
        return 0

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[Any]:
        if h == "g0":
            return [
                SimpleNamespace(pid=101, usedGpuMemory=2048 * MIB),
                SimpleNamespace(pid=202, usedGpuMemory=None),
            ]
        return []

    def nvmlEventSetCreate(self) -> str:
        return "events"

    def nvmlEventSetFree(self, s: str) -> None: ...

    def nvmlDeviceRegisterEvents(self, h: str, kinds: int, s: str) -> None:
        if h == "g1":
            self._fail("events")

    def nvmlEventSetWait_v2(self, s: str, timeout_ms: int) -> Any:
        if not self.xid_queue:
            raise self.NVMLError("Timeout")
        return self.xid_queue.pop(0)


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml()


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    (tmp_path / "101").mkdir()
    (tmp_path / "101" / "cgroup").write_text(f"0::/system.slice/docker-{CID}.scope\n")
    (tmp_path / "202").mkdir()
    (tmp_path / "202" / "cgroup").write_text("0::/user.slice/session-1.scope\n")
    return tmp_path


def test_it_discovers_whole_gpus_and_mig_instances(fake: FakeNvml, proc_root: Path) -> None:
    gpus = NvmlBackend(nvml=fake, proc_root=proc_root).discover()

    assert [(g.uuid, g.kind, g.parent_uuid, g.index) for g in gpus] == [
        ("GPU-0", "gpu", None, 0),
        ("GPU-1", "gpu", None, 1),
        ("MIG-a", "mig", "GPU-1", 1),
        ("MIG-b", "mig", "GPU-1", 1),
    ]
    assert gpus[0].model == "NVIDIA H100 80GB HBM3"
    assert gpus[1].model == "NVIDIA A100-SXM4-40GB"  # bytes from older bindings decoded
    assert [g.memory_mb for g in gpus] == [81920, 40960, 20480, 20480]


def test_each_metric_is_read_on_its_own_and_missing_ones_are_none(
    fake: FakeNvml, proc_root: Path
) -> None:
    by_uuid = {s.gpu_uuid: s for s in NvmlBackend(nvml=fake, proc_root=proc_root).sample(12.5)}

    whole = by_uuid["GPU-0"]
    assert (whole.ts, whole.util_pct, whole.temp_c, whole.power_w) == (12.5, 87.0, 64.0, 312.5)
    assert (whole.mem_used_mb, whole.mem_total_mb) == (20480, 81920)
    assert (whole.sm_clock_mhz, whole.ecc_errors, whole.xid_errors) == (1980, 2, 0)
    no_power = by_uuid["GPU-1"]
    assert no_power.power_w is None and no_power.ecc_errors is None
    assert no_power.xid_errors is None  # could not subscribe to XID events
    assert no_power.util_pct == 87.0
    mig = by_uuid["MIG-a"]
    assert mig.util_pct is None and mig.temp_c is None and mig.mem_total_mb == 20480


def test_processes_are_traced_to_their_container(fake: FakeNvml, proc_root: Path) -> None:
    sample = NvmlBackend(nvml=fake, proc_root=proc_root).sample(0.0)[0]

    assert [(p.pid, p.used_mb, p.container_id) for p in sample.processes] == [
        (101, 2048, CID),
        (202, None, None),  # not in a container, and NVML withheld its memory
    ]


def test_xid_events_are_counted_per_gpu(fake: FakeNvml, proc_root: Path) -> None:
    backend = NvmlBackend(nvml=fake, proc_root=proc_root)
    fake.xid_queue = [SimpleNamespace(device="g0", eventData=79)] * 2

    assert backend.sample(0.0)[0].xid_errors == 2
    assert backend.sample(1.0)[0].xid_errors == 2  # a count since the agent started


def test_close_shuts_nvml_down(fake: FakeNvml, proc_root: Path) -> None:
    NvmlBackend(nvml=fake, proc_root=proc_root).close()

    assert fake.shut_down


@pytest.mark.nvml
def test_the_real_nvml_path_discovers_and_samples_this_machines_gpus(nvml_backend: Any) -> None:
    gpus = nvml_backend.discover()
    samples = nvml_backend.sample(1.0)
    # Printed so a run on a GPU machine documents what it saw (pytest -s).
    print(
        json.dumps(
            {"gpus": [g.as_wire() for g in gpus], "samples": [s.as_wire() for s in samples]},
            indent=1,
        )
    )

    assert gpus, "NVML initialised but reported no GPUs"
    assert len({g.uuid for g in gpus}) == len(gpus)
    whole = [g for g in gpus if g.kind == "gpu"]
    assert all(g.uuid.startswith("GPU-") and g.memory_mb > 1024 for g in whole)
    assert all(g.parent_uuid in {w.uuid for w in whole} for g in gpus if g.kind == "mig")
    assert {s.gpu_uuid for s in samples} == {g.uuid for g in gpus}
    for sample in samples:
        if sample.mem_total_mb is not None:
            assert 0 <= sample.mem_used_mb <= sample.mem_total_mb
    first = next(s for s in samples if s.gpu_uuid == whole[0].uuid)
    assert first.temp_c is not None and 0 < first.temp_c < 120
    assert first.util_pct is not None and 0 <= first.util_pct <= 100

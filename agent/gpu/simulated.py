"""A GPU backend for machines without a GPU: the demo and the tests.

A job can ask it for trouble, so that the demo and the tests exercise every
alert rule through the real agent: the agent passes the job's
``LABPORTAL_SIMULATE`` variable (comma-separated ``SIM_CONDITIONS``) to
``simulate``. ``idle`` keeps the job's GPUs near 0 %; ``leak`` leaves its
memory held after it ends, until the agent's clean-up; ``stray`` puts a
process of no job on its GPU; ``hot`` heats the GPU past 90 °C; ``ecc`` and
``xid`` make the GPU count new errors.

It reports ``count`` identical GPUs whose readings follow the jobs the agent
says run on them: an idle GPU sits cool at a few percent, a busy one warms up
and draws power in proportion to its load, which wobbles slowly and drops for a
minute or so at each of the job's periodic evaluations or checkpoints. Everything random comes from one
``random.Random(seed)``, and time only enters through the ``now`` argument, so
the same seed and the same calls give the same samples (no sleeping in tests).
"""

from __future__ import annotations

import math
import random
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agent.gpu.base import GpuBackend, GpuInfo, GpuSample, ProcessSample
from agent.gpu.cgroup import slurm_job_id_for_pid

# A fixed namespace so a node's simulated UUIDs survive agent restarts: the
# portal upserts GPUs by UUID, and fresh UUIDs on every start would look like
# new hardware and leave "missing" ghosts behind.
_SIM_NAMESPACE = uuid.UUID("6d1f6c3e-8f3b-4a8e-9a57-3f0b7f1e2c11")

AMBIENT_C = 30.0
THERMAL_TAU_S = 60.0  # time constant of the temperature's approach to its target
UTIL_TAU_S = 5.0
IDLE_POWER_W = 60.0
MAX_POWER_W = 400.0
IDLE_SM_MHZ = 210
BUSY_SM_MHZ = 1410
SIM_CONDITIONS = ("idle", "leak", "stray", "hot", "ecc", "xid")
HOT_C = 95.0
STRAY_PID_BASE = 900_000


@dataclass
class _SimJob:
    job_id: int
    container_id: str | None
    pid: int
    target_util: float  # the load this job puts on each of its GPUs
    footprint_mb: int  # the GPU memory it settles at per GPU
    started_at: float | None = None
    leaked: bool = False  # ended, but its memory is still held
    # Training-like phases: a slow wobble of the load, and every `dip_every_s` an
    # evaluation or checkpoint of `dip_len_s` during which the GPU mostly waits.
    wobble_period_s: float = 600.0
    dip_every_s: float = 1200.0
    dip_len_s: float = 60.0

    def load_at(self, now: float) -> float:
        """The load this job puts on its GPUs at `now` (its phases, before noise and lag)."""
        if self.started_at is None:
            return self.target_util
        elapsed = now - self.started_at
        if elapsed >= self.dip_every_s and elapsed % self.dip_every_s < self.dip_len_s:
            return self.target_util * 0.25
        return self.target_util * (
            1.0 + 0.06 * math.sin(2 * math.pi * elapsed / self.wobble_period_s)
        )


@dataclass
class _SimGpu:
    info: GpuInfo
    util: float = 0.0
    temp: float = AMBIENT_C + 5.0
    last_ts: float | None = None
    jobs: dict[int, _SimJob] = field(default_factory=dict)


def simulated_gpu_uuid(node_name: str, index: int) -> str:
    """The stable UUID of simulated GPU ``index`` on ``node_name``."""
    return f"GPU-{uuid.uuid5(_SIM_NAMESPACE, f'{node_name}/{index}')}"


class SimulatedBackend(GpuBackend):
    """``count`` simulated GPUs with plausible, deterministic dynamics."""

    name = "simulated"

    def __init__(
        self,
        count: int = 2,
        *,
        node_name: str = "sim",
        seed: int = 0,
        model: str = "Simulated A100 80GB",
        memory_mb: int = 81920,
        proc_root: Path = Path("/proc"),
    ) -> None:
        if count < 0:
            raise ValueError("count must be >= 0")
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._gpus = [
            _SimGpu(
                GpuInfo(
                    uuid=simulated_gpu_uuid(node_name, i),
                    index=i,
                    model=model,
                    memory_mb=memory_mb,
                )
            )
            for i in range(count)
        ]
        self._by_uuid = {g.info.uuid: g for g in self._gpus}
        self._conditions: dict[int, set[str]] = {}
        self._errors: dict[str, list[int]] = {g.info.uuid: [0, 0] for g in self._gpus}
        # Processes of no portal job (e.g. a Slurm job's), read like NVML's: pid -> (GPU, MiB).
        self._foreign: dict[int, tuple[str, int]] = {}
        self._proc_root = proc_root

    def add_foreign_process(self, gpu_uuid: str, pid: int, used_mb: int) -> None:
        """Show a process the agent did not start on a GPU; its Slurm job comes from its cgroup."""
        with self._lock:
            self._foreign[pid] = (gpu_uuid, used_mb)

    def simulate(self, job_id: int, conditions: Iterable[str]) -> None:
        with self._lock:
            wanted = {c for c in conditions if c in SIM_CONDITIONS}
            if wanted:
                self._conditions[job_id] = wanted
            for gpu in self._gpus:  # the job may already be attached
                job = gpu.jobs.get(job_id)
                if job is not None and "idle" in wanted:
                    job.target_util = 1.0

    def release_job(self, job_id: int) -> None:
        with self._lock:
            for gpu in self._gpus:
                job = gpu.jobs.get(job_id)
                if job is not None and job.leaked:
                    del gpu.jobs[job_id]
            self._conditions.pop(job_id, None)

    def discover(self) -> list[GpuInfo]:
        return [g.info for g in self._gpus]

    def attach_job(self, job_id: int, gpu_uuids: Iterable[str], container_id: str | None) -> None:
        with self._lock:
            # The job's character is drawn from its id, not from the shared
            # stream, so attach order does not change other jobs' dynamics.
            job_rng = random.Random(f"{job_id}")
            # Roughly one job in eight idles on its GPUs, so the portal's
            # idle-GPU alert has something to find in the demo.
            idle = job_rng.random() < 0.125 or "idle" in self._conditions.get(job_id, ())
            target = job_rng.uniform(1.0, 4.0) if idle else job_rng.uniform(55.0, 98.0)
            # Its phases from a stream of their own, so adding them changed no other draw.
            phases = random.Random(f"{job_id}/phases")
            wobble, every, length = (
                phases.uniform(300.0, 900.0),
                phases.uniform(900.0, 1800.0),
                phases.uniform(30.0, 90.0),
            )
            for gpu_uuid in gpu_uuids:
                gpu = self._by_uuid.get(gpu_uuid)
                if gpu is None:
                    continue  # not ours: the portal's problem, not a crash here
                footprint = int(gpu.info.memory_mb * job_rng.uniform(0.2, 0.85))
                gpu.jobs[job_id] = _SimJob(
                    job_id=job_id,
                    container_id=container_id,
                    pid=100_000 + job_id,
                    target_util=target,
                    footprint_mb=footprint,
                    wobble_period_s=wobble,
                    dip_every_s=every,
                    dip_len_s=length,
                )

    def detach_job(self, job_id: int) -> None:
        with self._lock:
            leaks = "leak" in self._conditions.get(job_id, ())
            for gpu in self._gpus:
                job = gpu.jobs.get(job_id)
                if job is not None and leaks:
                    job.leaked = True  # the process is gone, its memory is not
                    job.target_util = 0.0
                else:
                    gpu.jobs.pop(job_id, None)
            if not leaks:
                self._conditions.pop(job_id, None)

    def running_job_ids(self) -> set[int]:
        """Jobs currently attached to any simulated GPU (for tests and the demo)."""
        with self._lock:
            return {job_id for g in self._gpus for job_id, j in g.jobs.items() if not j.leaked}

    def sample(self, now: float) -> list[GpuSample]:
        with self._lock:
            return [self._sample_gpu(gpu, now) for gpu in self._gpus]

    def _sample_gpu(self, gpu: _SimGpu, now: float) -> GpuSample:
        dt = 0.0 if gpu.last_ts is None else max(0.0, now - gpu.last_ts)
        gpu.last_ts = now
        noise = self._rng.gauss(0.0, 1.0)

        live = [j for j in gpu.jobs.values() if not j.leaked]
        target_util = min(100.0, sum(j.load_at(now) for j in live)) if live else 0.0
        wants = set().union(*(self._conditions.get(j.job_id, set()) for j in live))
        # First-order lag towards the target, so a job start ramps rather than jumps.
        alpha = 1.0 - math.exp(-dt / UTIL_TAU_S) if dt else (1.0 if gpu.jobs else 0.0)
        gpu.util += (target_util - gpu.util) * alpha
        # A near-idle job jitters a little, not by several percent.
        jitter = (3.0 if target_util >= 20.0 else 0.2) if live else 0.0
        util = min(100.0, max(0.0, gpu.util + jitter * noise))

        target_temp = AMBIENT_C + 5.0 + 50.0 * util / 100.0
        if "hot" in wants:
            # Straight there: the demo should not wait minutes for a fan to fail.
            target_temp = gpu.temp = HOT_C
        beta = 1.0 - math.exp(-dt / THERMAL_TAU_S) if dt else 0.0
        gpu.temp += (target_temp - gpu.temp) * beta

        processes = []
        mem_used = 0
        for job in gpu.jobs.values():
            if job.started_at is None:
                job.started_at = now
            # Memory fills over the first ~20 s as the model loads.
            ramp = min(1.0, (now - job.started_at) / 20.0 + 0.1)
            used = int(job.footprint_mb * ramp)
            mem_used += used
            processes.append(
                ProcessSample(
                    pid=job.pid,
                    used_mb=used,
                    container_id=job.container_id,
                    job_id=job.job_id,
                )
            )
            if "stray" in self._conditions.get(job.job_id, ()) and not job.leaked:
                stray_mb = 2048
                mem_used += stray_mb
                processes.append(
                    ProcessSample(
                        pid=STRAY_PID_BASE + job.job_id, used_mb=stray_mb, unix_user="mallory"
                    )
                )
        for pid, (gpu_uuid, used_mb) in self._foreign.items():
            if gpu_uuid == gpu.info.uuid:
                mem_used += used_mb
                processes.append(
                    ProcessSample(
                        pid=pid,
                        used_mb=used_mb,
                        slurm_job_id=slurm_job_id_for_pid(pid, self._proc_root),
                    )
                )
        total = gpu.info.memory_mb
        mem_used = min(total, mem_used + 4)  # the driver keeps a few MiB

        errors = self._errors[gpu.info.uuid]
        errors[0] += "ecc" in wants
        errors[1] += "xid" in wants
        power = IDLE_POWER_W + (MAX_POWER_W - IDLE_POWER_W) * util / 100.0
        power = max(IDLE_POWER_W * 0.8, power + 4.0 * self._rng.gauss(0.0, 1.0))
        return GpuSample(
            gpu_uuid=gpu.info.uuid,
            ts=now,
            util_pct=round(util, 1),
            mem_used_mb=mem_used,
            mem_total_mb=total,
            temp_c=round(gpu.temp, 1),
            power_w=round(power, 1),
            sm_clock_mhz=BUSY_SM_MHZ if live else IDLE_SM_MHZ,
            ecc_errors=errors[0],
            xid_errors=errors[1],
            processes=processes,
        )

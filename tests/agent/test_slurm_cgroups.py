"""Slurm mode: GPU processes are attributed to Slurm jobs through their cgroup paths."""

from __future__ import annotations

from pathlib import Path

from agent.gpu.base import GpuSample, ProcessSample
from agent.gpu.cgroup import slurm_job_id_for_pid, slurm_job_id_from_cgroup
from agent.node import NodeAgent
from tests.agent.test_alert_support import backend, local_agent  # noqa: F401 (fixtures)

V1 = """12:memory:/slurm/uid_1000/job_4242/step_0/task_0
11:devices:/slurm/uid_1000/job_4242/step_0
1:name=systemd:/system.slice/slurmd.service
"""
V2 = "0::/system.slice/slurmstepd.scope/job_77/step_batch/user/task_0\n"


def test_it_reads_the_job_id_from_cgroup_v1_and_v2_paths() -> None:
    assert slurm_job_id_from_cgroup(V1) == 4242
    assert slurm_job_id_from_cgroup(V2) == 77


def test_processes_outside_slurm_have_no_job() -> None:
    assert slurm_job_id_from_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") is None
    assert slurm_job_id_from_cgroup("0::/system.slice/slurmstepd.scope/system\n") is None
    assert slurm_job_id_from_cgroup("0::/docker/job_12x\n") is None
    assert slurm_job_id_from_cgroup("garbage") is None


def test_it_maps_pids_through_proc_and_a_vanished_pid_is_not_an_error(tmp_path: Path) -> None:
    for pid, text in ((101, V1), (102, V2), (103, "0::/init.scope\n")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    assert [slurm_job_id_for_pid(p, tmp_path) for p in (101, 102, 103, 104)] == [
        4242,
        77,
        None,
        None,
    ]


def test_the_slurm_job_goes_on_the_wire_only_when_known() -> None:
    sample = GpuSample(
        gpu_uuid="GPU-1",
        ts=0.0,
        processes=[
            ProcessSample(pid=1, used_mb=10, slurm_job_id=77),
            ProcessSample(pid=2, used_mb=1),
        ],
    )
    first, second = sample.as_wire()["processes"]
    assert first["slurm_job_id"] == 77 and "slurm_job_id" not in second


def test_the_agent_keeps_the_slurm_job_and_names_no_owner_for_it(
    local_agent: NodeAgent,  # noqa: F811
) -> None:
    sample = GpuSample(
        gpu_uuid="GPU-x",
        ts=0.0,
        processes=[ProcessSample(pid=2**22 + 1, used_mb=5, slurm_job_id=42)],
    )
    (process,) = local_agent._attribute(sample).processes
    assert process.slurm_job_id == 42 and process.unix_user is None and process.job_id is None

"""What the agent does for alerts and shared slots: slot ids run on their GPU, clean-up after
ended jobs touches only what is provably theirs, and the simulated backend produces each condition."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.gpu import SimulatedBackend
from agent.node import NodeAgent
from agent.reporter import ControlReporter
from agent.runtime import ContainerRuntime, JobSpec
from agent.runtime.local import LocalProcessRuntime
from tests.agent.support import RecordingApp, job_spec, proc_state, wait_until


def runtime_of(agent: NodeAgent) -> ContainerRuntime:
    """The agent's runtime (these agents run jobs; only a monitor-only agent has none)."""
    assert agent.runtime is not None
    return agent.runtime


NODE = "sim01"


@pytest.fixture
def backend() -> SimulatedBackend:
    return SimulatedBackend(2, node_name=NODE, seed=3)


@pytest.fixture
def local_agent(tmp_path: Path, backend: SimulatedBackend) -> NodeAgent:
    return NodeAgent(
        node=NODE,
        backend=backend,
        runtime=LocalProcessRuntime(tmp_path, enabled=True),
        reporter=ControlReporter(RecordingApp(), NODE, "t"),
    )


def uuid0(backend: SimulatedBackend) -> str:
    return backend.discover()[0].uuid


def alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z", "X")


def test_a_slot_job_runs_on_its_parent_gpu(
    local_agent: NodeAgent, backend: SimulatedBackend
) -> None:
    gpu = uuid0(backend)
    script = 'echo "cuda=$CUDA_VISIBLE_DEVICES"; sleep 5'
    for job_id, slot in ((1, 0), (2, 1)):
        result = local_agent.start_job(
            job_spec(
                job_id,
                command=["sh", "-c", script],
                gpu_uuids=[f"{gpu}::slot{slot}"],
                gpu_indices=[0],
            )
        )
        assert result["ok"], result
    wait_until(lambda: "cuda=" in (runtime_of(local_agent).logs(2, 5) or ""))
    assert f"cuda={gpu}\n" in (runtime_of(local_agent).logs(1, 5) or "")
    [sample] = [s for s in backend.sample(10.0) if s.gpu_uuid == gpu]
    assert sorted(p.job_id or 0 for p in sample.processes) == [1, 2]  # two jobs on one GPU
    for job_id in (1, 2):
        local_agent.stop_job(job_id, 0, "test over")


def test_a_slot_of_a_gpu_that_is_not_here_is_refused(local_agent: NodeAgent) -> None:
    result = local_agent.start_job(job_spec(3, gpu_uuids=["GPU-elsewhere::slot0"]))
    assert not result["ok"] and "GPU-elsewhere::slot0" in result["reason"]


def test_docker_gets_the_parent_gpu_of_a_slot() -> None:
    spec = JobSpec.from_wire(job_spec(4, gpu_uuids=["GPU-a::slot0", "GPU-a::slot1", "GPU-b"]))
    assert spec.device_uuids == ["GPU-a", "GPU-b"] and spec.visible_devices() == "GPU-a,GPU-b"


def test_cleanup_kills_the_leftovers_of_an_ended_job_and_nothing_else(
    local_agent: NodeAgent, tmp_path: Path
) -> None:
    # Job 5 leaves a child behind when it exits; job 6 still runs; an unrelated process runs too.
    script = 'sleep 300 & echo "child=$!"; exit 0'
    assert local_agent.start_job(job_spec(5, command=["sh", "-c", script]))["ok"]
    assert local_agent.start_job(job_spec(6, command=["sh", "-c", "sleep 300"]))["ok"]
    import subprocess

    bystander = subprocess.Popen(["sleep", "300"])
    try:
        log = wait_until(
            lambda: (
                "child=" in (runtime_of(local_agent).logs(5, 5) or "")
                and runtime_of(local_agent).logs(5, 5)
            )
        )
        child = int(log.split("child=")[1].split()[0])
        wait_until(lambda: runtime_of(local_agent).list_jobs()[0].state == "exited")
        local_agent.watch_once()  # the agent reports job 5's exit
        assert alive(child)

        result = local_agent.cleanup_ended_jobs([5, 6, 999])

        assert result["killed_pids"] == [child]
        wait_until(lambda: not alive(child))
        assert result["removed_jobs"] == [5]
        assert alive(bystander.pid)
        running = [s for s in runtime_of(local_agent).list_jobs() if s.job_id == 6]
        assert running and running[0].running  # a job the agent runs is never touched
    finally:
        bystander.kill()
        bystander.wait()
        local_agent.stop_job(6, 0, "test over")


def test_the_simulated_backend_produces_each_condition_on_request(
    backend: SimulatedBackend,
) -> None:
    gpu = uuid0(backend)
    backend.simulate(7, ["idle", "stray", "hot", "ecc", "xid", "nonsense"])
    backend.attach_job(7, [gpu], "c7")
    first = [s for s in backend.sample(0.0) if s.gpu_uuid == gpu][0]
    readings = [s for t in range(5, 300, 5) for s in backend.sample(float(t)) if s.gpu_uuid == gpu]
    last = readings[-1]
    assert max(s.util_pct or 0 for s in readings) < 5.0  # idle
    assert (last.temp_c or 0) >= 90.0  # hot
    assert (last.ecc_errors or 0) > (first.ecc_errors or 0)
    assert (last.xid_errors or 0) > (first.xid_errors or 0)
    strays = [p for p in last.processes if p.job_id is None]
    assert len(strays) == 1 and strays[0].unix_user == "mallory" and strays[0].container_id is None


def test_a_simulated_leak_holds_memory_after_the_job_until_the_agent_cleans_up(
    backend: SimulatedBackend,
) -> None:
    gpu = uuid0(backend)
    backend.simulate(8, ["leak"])
    backend.attach_job(8, [gpu], "c8")
    backend.sample(0.0)
    backend.detach_job(8)
    [after] = [s for s in backend.sample(60.0) if s.gpu_uuid == gpu]
    assert [p.job_id for p in after.processes] == [8] and (after.mem_used_mb or 0) > 1000
    assert 8 not in backend.running_job_ids()
    backend.release_job(8)
    [freed] = [s for s in backend.sample(65.0) if s.gpu_uuid == gpu]
    assert freed.processes == [] and (freed.mem_used_mb or 0) < 10


def test_a_stray_process_is_reported_with_its_unix_user(local_agent: NodeAgent) -> None:
    from agent.node import unix_user_of

    assert unix_user_of(os.getpid()) is not None
    assert unix_user_of(2**22 + 12345) is None


def test_cleanup_waits_for_a_wrapper_that_has_written_the_exit_code_but_not_yet_exited(
    local_agent: NodeAgent,
) -> None:
    # The agent can see a job's exit code before the job's wrapper process has exited;
    # a cleanup in that moment must still kill the leftovers, not find the leader alive.
    import subprocess

    script = 'sleep 300 & echo "child=$!"; exit 0'
    assert local_agent.start_job(job_spec(8, command=["sh", "-c", script]))["ok"]
    runtime = runtime_of(local_agent)
    log = wait_until(lambda: "child=" in (runtime.logs(8, 5) or "") and runtime.logs(8, 5))
    child = int(log.split("child=")[1].split()[0])
    wait_until(lambda: any(s.job_id == 8 and s.state == "exited" for s in runtime.list_jobs()))
    local_agent.watch_once()
    # Stand in for a wrapper still finishing: the runtime's handle on job 8's leader
    # becomes a process that exits a moment later.
    finishing = subprocess.Popen(["sleep", "0.3"])
    runtime._procs[8] = finishing  # type: ignore[attr-defined]
    try:
        result = local_agent.cleanup_ended_jobs([8])
        assert result["killed_pids"] == [child]
        wait_until(lambda: not alive(child))
    finally:
        finishing.wait()
        if alive(child):
            os.kill(child, 9)

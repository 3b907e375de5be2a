"""A monitor-only agent (a Slurm node): no container runtime, job commands refused, telemetry
with each GPU process's Slurm job as before."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent import tasks
from agent.config import ConfigError, load_config
from agent.gpu import SimulatedBackend
from agent.main import main
from agent.node import AgentTiming, NodeAgent
from agent.reporter import ControlReporter
from protocol.signing import CommandVerifier
from tests.agent.support import RecordingApp, job_spec, signed

NODE, TOKEN = "gpu01", "lpn_monitor-only-node-token"
BASE = ["--name", NODE, "--broker", "redis://portal:6379/0", "--token", "tok"]
SLURM_CGROUP = "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("LABPORTAL_"):
            monkeypatch.delenv(key)


def test_the_flag_or_the_variable_turns_it_on_and_mount_roots_are_not_needed() -> None:
    assert load_config([*BASE, "--monitor-only"], {}).monitor_only is True
    assert load_config(BASE, {"LABPORTAL_MONITOR_ONLY": "1"}).monitor_only is True
    with pytest.raises(ConfigError, match="LABPORTAL_ALLOWED_MOUNT_ROOTS"):
        load_config(BASE, {"LABPORTAL_MONITOR_ONLY": "0"})
    with pytest.raises(ConfigError, match="LABPORTAL_MONITOR_ONLY is 'sometimes'"):
        load_config(BASE, {"LABPORTAL_MONITOR_ONLY": "sometimes"})


def test_it_starts_without_any_container_runtime(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # docker is the default runtime and this node has none: a normal agent stops there
    # (exit 2); a monitor-only one goes on to the broker (unreachable here: exit 3).
    argv = [
        "--name", NODE, "--token", "tok", "--broker", "redis://127.0.0.1:1/0",
        "--gpu-backend", "simulated", "--state-dir", str(tmp_path), "--monitor-only",
    ]  # fmt: skip
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "cannot reach the broker" in err and "LABPORTAL_RUNTIME" not in err


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    (tmp_path / "5001").mkdir()
    (tmp_path / "5001" / "cgroup").write_text(SLURM_CGROUP)
    return tmp_path


@pytest.fixture
def backend(proc_root: Path) -> SimulatedBackend:
    return SimulatedBackend(2, node_name=NODE, seed=1, proc_root=proc_root)


@pytest.fixture
def app() -> RecordingApp:
    return RecordingApp()


@pytest.fixture
def agent(app: RecordingApp, backend: SimulatedBackend) -> NodeAgent:
    return NodeAgent(
        node=NODE,
        backend=backend,
        runtime=None,
        reporter=ControlReporter(app, NODE, TOKEN),
        timing=AgentTiming(samples_per_batch=1),
        verifier=CommandVerifier(TOKEN, NODE),
        clock=lambda: 100.0,
    )


def test_it_registers_and_heartbeats_as_monitor_only(agent: NodeAgent, app: RecordingApp) -> None:
    agent.reconcile()
    agent.register()
    agent.watch_once()
    agent.cleanup_once()
    agent.heartbeat_once()

    ((_, _, info),) = app.args_of("control.node_register")
    assert info["runtime"] == "none" and info["monitor_only"] is True
    assert [g["index"] for g in info["gpus"]] == [0, 1]
    ((_, _, beat),) = app.args_of("control.node_heartbeat")
    assert beat["monitor_only"] is True and beat["running_job_ids"] == []


def test_gpu_processes_go_out_with_their_slurm_job(
    agent: NodeAgent, app: RecordingApp, backend: SimulatedBackend
) -> None:
    gpu = backend.discover()[1].uuid
    backend.add_foreign_process(gpu, 5001, 3000)  # in Slurm job 4242's cgroup
    backend.add_foreign_process(gpu, 5002, 100)  # outside Slurm (no cgroup file)

    agent.sample_once()

    ((_, _, samples),) = app.args_of("control.samples_ingest")
    (sample,) = [s for s in samples if s["gpu_uuid"] == gpu]
    slurm, other = sorted(sample["processes"], key=lambda p: p["pid"])
    assert slurm["slurm_job_id"] == 4242 and slurm["job_id"] is None
    assert "slurm_job_id" not in other
    assert sample["mem_used_mb"] >= 3100


@pytest.mark.parametrize(
    ("task", "args"),
    [
        (tasks.start_job, [job_spec(7)]),
        (tasks.stop_job, [7, 5, "cancelled"]),
        (tasks.job_logs, [7, 50]),
        (tasks.cleanup_ended_jobs, [[7]]),
    ],
)
def test_job_commands_are_refused_and_the_refusal_is_reported(
    agent: NodeAgent, app: RecordingApp, task: object, args: list[object]
) -> None:
    name = task.name  # type: ignore[attr-defined]
    tasks.set_node_agent(agent)
    try:
        auth = signed(name, NODE, args, token=TOKEN)
        result = task.apply(args=args, kwargs={"auth": auth}).result  # type: ignore[attr-defined]
    finally:
        tasks.set_node_agent(None)

    assert result["ok"] is False and result["refused"] == "monitor_only"
    ((_, _, refused_task, reason, detail),) = app.args_of("control.command_refused")
    assert (refused_task, reason) == (name, "monitor_only")
    assert "monitor-only" in detail and "Slurm" in detail
    assert app.args_of("control.job_event") == []

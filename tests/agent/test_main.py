"""The ``labportal-agent`` command: clear configuration errors, and a real run end to end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from kombu import Connection

from agent.config import ConfigError, load_config
from agent.gpu.simulated import simulated_gpu_uuid
from agent.main import broker_transport_options, main
from tests.agent.support import drain_queue as _drain
from tests.agent.support import job_spec, signed

BASE = [
    "--name", "gpu01", "--broker", "redis://portal:6379/0", "--token", "tok",
    "--allowed-mount-root", "none",
]  # fmt: skip


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("LABPORTAL_"):
            monkeypatch.delenv(key)


@pytest.mark.parametrize(
    ("argv", "env", "names"),
    [
        ([], {}, "LABPORTAL_NODE_NAME (--name) is not set"),
        (["--name", "gpu01"], {}, "LABPORTAL_BROKER_URL (--broker) is not set"),
        (["--name", "gpu01", "--broker", "redis://x"], {}, "LABPORTAL_NODE_TOKEN (--token) is not set"),
        (["--name", "gpu 01", *BASE[2:]], {}, "LABPORTAL_NODE_NAME (--name) is 'gpu 01'"),
        (BASE[:6], {}, "LABPORTAL_ALLOWED_MOUNT_ROOTS (--allowed-mount-root) is not set"),
        (BASE, {"LABPORTAL_GPU_BACKEND": "cuda"}, "one of: auto, nvml, simulated"),
        (BASE, {"LABPORTAL_SAMPLE_INTERVAL": "soon"}, "LABPORTAL_SAMPLE_INTERVAL (--sample-interval) is 'soon'"),
        (BASE, {"LABPORTAL_SIM_GPUS": "-1"}, "must be at least 0"),
        (BASE, {"LABPORTAL_ALLOW_LOCAL_RUNTIME": "maybe"}, "LABPORTAL_ALLOW_LOCAL_RUNTIME is 'maybe'"),
        (BASE + ["--frobnicate"], {}, "unrecognized arguments: --frobnicate"),
        (BASE + ["--runtime", "local"], {}, "LABPORTAL_ALLOW_LOCAL_RUNTIME=1"),
        (BASE + ["--gpu-backend", "nvml"], {}, "LABPORTAL_GPU_BACKEND (--gpu-backend) is nvml, but"),
    ],
)  # fmt: skip
def test_bad_configuration_names_the_setting_and_exits_nonzero_without_a_traceback(
    argv: list[str],
    env: dict[str, str],
    names: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("LABPORTAL_AGENT_STATE_DIR", str(tmp_path))
    if "nvml" in argv and _nvml_present():
        pytest.skip("this machine has a GPU, so NVML initialises")

    code = main(argv)

    err = capsys.readouterr().err
    assert code == 2
    assert names in err
    assert "Traceback" not in err and err.startswith("labportal-agent: error: ")


def _nvml_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


def test_flags_win_over_environment_variables_which_win_over_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {
        "LABPORTAL_NODE_NAME": "from-env",
        "LABPORTAL_BROKER_URL": "redis://env:6379/0",
        "LABPORTAL_NODE_TOKEN": "env-token",
        "LABPORTAL_SIM_GPUS": "3",
        "LABPORTAL_ALLOWED_MOUNT_ROOTS": "/data:/scratch",
        "LABPORTAL_HEARTBEAT_INTERVAL": "2.5",
    }
    cfg = load_config(["--name", "from-flag"], env)

    assert (cfg.name, cfg.broker_url, cfg.token) == ("from-flag", "redis://env:6379/0", "env-token")
    assert (cfg.sim_gpus, cfg.heartbeat_interval_s, cfg.sample_interval_s) == (3, 2.5, 5.0)
    assert cfg.allowed_mount_roots == ("/data", "/scratch")
    assert (cfg.gpu_backend, cfg.runtime, cfg.allow_local_runtime) == ("auto", "docker", False)
    with pytest.raises(ConfigError, match="absolute path"):
        load_config(BASE[:6], {"LABPORTAL_ALLOWED_MOUNT_ROOTS": "data"})
    assert load_config(BASE, {}).allowed_mount_roots == ()  # "none": no mount at all


def test_print_info_shows_what_would_be_registered_without_a_broker(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--print-info", "--gpu-backend", "simulated", "--sim-gpus", "2"]) == 0

    out = capsys.readouterr().out
    assert '"gpu_backend": "simulated"' in out and out.count('"kind": "gpu"') == 2


def test_an_unreachable_broker_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = [
        "--name", "gpu01", "--token", "tok", "--allowed-mount-root", "none", "--broker", "redis://:secret@127.0.0.1:1/0",
        "--runtime", "local", "--allow-local-runtime", "--gpu-backend", "simulated",
        "--state-dir", str(tmp_path),
    ]  # fmt: skip
    code = main(argv)

    err = capsys.readouterr().err
    assert code == 3
    assert "cannot reach the broker at redis://:**@127.0.0.1:1/0" in err
    assert "secret" not in err


E2E_TOKEN = "lpn_e2e-node-token-for-tests"


@pytest.mark.e2e
def test_the_agent_process_serves_its_own_queue_and_reports_to_control(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real agent process on kombu's filesystem broker with the local runtime."""
    # The portal side below is a plain Celery app, which would prefer this variable.
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    broker_dir = tmp_path / "broker"
    broker_dir.mkdir()
    # The same folders the agent derives from its URL (kombu would put fanout
    # exchanges in the working directory otherwise).
    transport = broker_transport_options(f"filesystem://{broker_dir}")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LABPORTAL_NODE_NAME": "e2e",
        "LABPORTAL_BROKER_URL": f"filesystem://{broker_dir}",
        "LABPORTAL_NODE_TOKEN": E2E_TOKEN,
        "LABPORTAL_RUNTIME": "local",
        "LABPORTAL_ALLOW_LOCAL_RUNTIME": "1",
        "LABPORTAL_GPU_BACKEND": "simulated",
        "LABPORTAL_SIM_GPUS": "1",
        "LABPORTAL_HEARTBEAT_INTERVAL": "0.3",
        "LABPORTAL_SAMPLE_INTERVAL": "0.3",
        "LABPORTAL_SAMPLE_BATCH": "2",
        "LABPORTAL_AGENT_STATE_DIR": str(tmp_path / "state"),
        "LABPORTAL_ALLOWED_MOUNT_ROOTS": "none",
    }
    portal = Celery("portal-test", broker="filesystem://")
    portal.conf.broker_transport_options = transport
    gpu = simulated_gpu_uuid("e2e", 0)
    script = 'trap "echo bye; exit 0" TERM; echo ready; while true; do sleep 0.1; done'
    spec = job_spec(1, command=["sh", "-c", script], gpu_uuids=[gpu], gpu_indices=[0])
    # Sent before the agent starts: it must pick this up from its own queue...
    start_auth = signed("agent.start_job", "e2e", [spec], token=E2E_TOKEN)
    portal.send_task("agent.start_job", args=[spec], kwargs={"auth": start_auth}, queue="node.e2e")
    # ...and never touch another node's.
    portal.send_task("agent.start_job", args=[job_spec(2)], queue="node.other")

    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.main"],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None  # stdout=PIPE
    output = proc.stdout
    seen: list[tuple[str, list[Any]]] = []
    try:
        with Connection("filesystem://", transport_options=transport) as conn:

            def wait_for(task: str, predicate: Any = lambda args: True) -> list[Any]:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    for name, args in seen:
                        if name == task and predicate(args):
                            return args
                    seen.extend(_drain(conn, "control"))
                    assert proc.poll() is None, output.read().decode()
                    time.sleep(0.1)
                raise AssertionError(f"no {task} within 30s; saw {[n for n, _ in seen]}")

            register = wait_for("control.node_register")
            assert register[0] == "e2e"
            # The token itself never goes on the broker: a signature made with its key does.
            assert E2E_TOKEN not in json.dumps(seen) and register[1]["kid"] == E2E_TOKEN[:10]
            assert register[2]["gpu_backend"] == "simulated" and register[2]["runtime"] == "local"
            started = wait_for("control.job_event", lambda a: a[2]["kind"] == "started")
            assert started[2]["job_id"] == 1
            wait_for("control.node_heartbeat", lambda a: a[2]["running_job_ids"] == [1])
            samples = wait_for(
                "control.samples_ingest", lambda a: any(s["processes"] for s in a[2])
            )
            assert samples[2][-1]["processes"][0]["job_id"] == 1

            stop_args = [1, 5, "cancelled by alice"]
            portal.send_task(
                "agent.stop_job",
                args=stop_args,
                kwargs={"auth": signed("agent.stop_job", "e2e", stop_args, token=E2E_TOKEN)},
                queue="node.e2e",
            )
            exited = wait_for("control.job_event", lambda a: a[2]["kind"] == "exited")
            assert exited[2]["exit_code"] == 0
            assert exited[2]["reason"] == "stopped: cancelled by alice"
            assert "bye" in exited[2]["log_tail"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert all(args[2].get("job_id") != 2 for name, args in seen if name == "control.job_event")
    assert len(list(broker_dir.glob("*.node.other.msg"))) == 1


class _RecordingTimer:
    """kombu's timer as the ticker uses it: repeating entries that can be cancelled."""

    class Entry:
        def __init__(self, seconds: float, fun: Any) -> None:
            self.seconds, self.fun, self.canceled = seconds, fun, False

        def cancel(self) -> None:
            self.canceled = True

    def __init__(self) -> None:
        self.entries: list[_RecordingTimer.Entry] = []

    def call_repeatedly(self, seconds: float, fun: Any) -> _RecordingTimer.Entry:
        entry = self.Entry(seconds, fun)
        self.entries.append(entry)
        return entry

    def live(self) -> list[_RecordingTimer.Entry]:
        return [e for e in self.entries if not e.canceled]


def test_the_event_loop_ticks_while_commands_are_in_flight_and_stops_when_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """celery/celery#6941: a threads-pool task is acked only when the event loop wakes, and
    a full prefetch window then holds the next start commands back (up to a second). The
    loop is kept turning while commands are in flight, and not on an idle agent."""
    from celery.worker import state as worker_state

    from agent.main import ACK_IDLE_TICKS, ACK_TICK_S, AckTicker

    active: set[object] = set()
    monkeypatch.setattr(worker_state, "active_requests", active)
    monkeypatch.setattr(worker_state, "reserved_requests", set())

    class Consumer:
        timer = _RecordingTimer()

    ticker = AckTicker()
    ticker.on_received()  # before the worker is ready: nothing to tick with
    assert Consumer.timer.entries == []
    ticker.on_ready(sender=Consumer())
    assert Consumer.timer.entries == []  # an idle agent does not tick

    ticker.on_received()
    ticker.on_received()  # a second command while ticking: still one entry
    assert [e.seconds for e in Consumer.timer.live()] == [ACK_TICK_S]
    entry = Consumer.timer.live()[0]
    active.add("a start command")
    for _ in range(3 * ACK_IDLE_TICKS):
        entry.fun()  # a long command keeps the loop turning
    assert not entry.canceled
    active.clear()
    for _ in range(ACK_IDLE_TICKS - 1):
        entry.fun()  # finished: ticks go on a while, for its acknowledgement
    assert not entry.canceled
    entry.fun()
    assert entry.canceled and Consumer.timer.live() == []

    ticker.on_received()  # the next command starts the ticks again
    assert len(Consumer.timer.live()) == 1


def test_the_ticker_ignores_a_sender_without_a_timer() -> None:
    from agent.main import AckTicker

    ticker = AckTicker()
    ticker.on_ready(sender=None)
    ticker.on_received()
    assert ticker.entry is None

"""The wire: task names the agent serves, and the messages it sends to the control queue."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent import tasks
from agent.celery_app import CONTROL_QUEUE, app, create_app, node_queue
from agent.gpu import SimulatedBackend
from agent.node import NodeAgent
from agent.reporter import ControlReporter
from protocol.signing import CommandVerifier, check, key_from_token
from tests.agent.support import FakeRuntime, RecordingApp, job_spec, signed

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def installed_agent() -> Iterator[tuple[NodeAgent, RecordingApp, FakeRuntime]]:
    recorder, runtime = RecordingApp(), FakeRuntime()
    node_agent = NodeAgent(
        node="gpu01",
        backend=SimulatedBackend(1, node_name="gpu01"),
        runtime=runtime,
        reporter=ControlReporter(recorder, "gpu01", "tok"),
        verifier=CommandVerifier("tok", "gpu01"),
    )
    tasks.set_node_agent(node_agent)
    yield node_agent, recorder, runtime
    tasks.set_node_agent(None)


def test_the_agent_serves_exactly_the_protocols_task_names() -> None:
    served = {name for name in app.tasks if name.startswith("agent.")}

    assert served == {
        "agent.start_job",
        "agent.stop_job",
        "agent.job_logs",
        "agent.cleanup_ended_jobs",
    }
    assert node_queue("gpu01") == "node.gpu01"
    assert app.conf.task_serializer == "json" and app.conf.accept_content == ["json"]


# Run in a fresh interpreter where Django and the portal's apps cannot be
# imported at all, as on a GPU server that has only the agent installed.
# (kombu itself probes for Django and copes with its absence.)
NO_DJANGO = """
import sys

BLOCKED = {"django", "labportal", "accounts", "cluster", "jobqueue", "telemetry", "reservations"}


class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked import of {name}")


sys.meta_path.insert(0, Block())
import agent.main, agent.tasks, agent.node, agent.runtime.docker_runtime, agent.runtime.local
import agent.gpu.nvml
from agent.celery_app import app, configure
from agent.reporter import ControlReporter

configure("memory://")
ControlReporter(app, "n", "t").heartbeat({"ts": 0.0, "running_job_ids": []})
assert sorted(n for n in app.tasks if n.startswith("agent.")) == [
    "agent.cleanup_ended_jobs", "agent.job_logs", "agent.start_job", "agent.stop_job"
]
"""


def test_the_agent_runs_where_django_and_the_portal_cannot_be_imported() -> None:
    result = subprocess.run(
        [sys.executable, "-c", NO_DJANGO], cwd=REPO_ROOT, capture_output=True, text=True
    )

    assert result.returncode == 0, result.stderr


def test_a_redelivered_start_job_task_starts_nothing(installed_agent: Any) -> None:
    node_agent, recorder, runtime = installed_agent
    spec = job_spec(5)

    # A redelivery is the same message twice; the portal's re-sends are signed anew.
    tasks.start_job.apply(
        args=[spec],
        kwargs={"auth": signed("agent.start_job", "gpu01", [spec])},
        task_id="delivery-1",
    )
    tasks.start_job.apply(
        args=[spec],
        kwargs={"auth": signed("agent.start_job", "gpu01", [spec])},
        task_id="delivery-1",
    )
    for _ in range(2):
        stop = [5, 1, "cancelled"]
        tasks.stop_job.apply(args=stop, kwargs={"auth": signed("agent.stop_job", "gpu01", stop)})
    tasks.job_logs.apply(args=[5, 10], kwargs={"auth": signed("agent.job_logs", "gpu01", [5, 10])})

    assert len(runtime.jobs) == 1
    assert [e["kind"] for e in recorder.events()] == ["started", "started", "exited"]
    assert len({e["event_id"] for e in recorder.events("started")}) == 1
    assert recorder.args_of("control.job_logs_report") == [["gpu01", "tok", 5, "out\n"]]


def test_cleanup_runs_only_when_the_portal_signed_it(installed_agent: Any) -> None:
    node_agent, recorder, runtime = installed_agent
    refused = tasks.cleanup_ended_jobs.apply(args=[[5]]).result
    forged = tasks.cleanup_ended_jobs.apply(
        args=[[5]], kwargs={"auth": signed("agent.cleanup_ended_jobs", "gpu01", [[6]])}
    ).result
    done = tasks.cleanup_ended_jobs.apply(
        args=[[5]], kwargs={"auth": signed("agent.cleanup_ended_jobs", "gpu01", [[5]])}
    ).result

    assert refused["ok"] is False and forged["ok"] is False
    assert done == {"killed_pids": [], "removed_jobs": []}


def test_tasks_fail_loudly_when_no_agent_is_installed() -> None:
    tasks.set_node_agent(None)
    result = tasks.job_logs.apply(args=[1, 1])

    assert isinstance(result.result, RuntimeError)


def test_reports_reach_the_control_queue_by_name_through_a_real_broker() -> None:
    """kombu's in-memory transport: the same publish path as Redis, minus the server."""
    broker_app = create_app("memory://")
    reporter = ControlReporter(broker_app, "gpu01", "tok")
    event = {"event_id": "1:exited:c1", "job_id": 1, "kind": "exited"}

    reporter.register({"hostname": "h", "gpus": []})
    reporter.heartbeat({"ts": 1.0, "running_job_ids": [1]})
    reporter.job_event(event)
    reporter.samples([{"gpu_uuid": "GPU-1", "ts": 1.0}])
    reporter.job_logs(1, "text")

    received = []
    with broker_app.connection_for_read() as conn, conn.SimpleQueue(CONTROL_QUEUE) as queue:
        for _ in range(5):
            message = queue.get(timeout=2)
            message.ack()
            args, kwargs, _embed = message.payload
            received.append((message.headers["task"], args, message.content_type))
        assert len(queue) == 0
    # Each message is signed with the token's key over exactly what was received.
    for task, args, _ in received:
        check(key_from_token("tok"), task=task, node="gpu01", args=args[2:], envelope=args[1])
    assert [(task, args[:1] + args[2:], ct) for task, args, ct in received] == [
        ("control.node_register", ["gpu01", {"hostname": "h", "gpus": []}], "application/json"),
        ("control.node_heartbeat", ["gpu01", {"ts": 1.0, "running_job_ids": [1]}], "application/json"),
        ("control.job_event", ["gpu01", event], "application/json"),
        ("control.samples_ingest", ["gpu01", [{"gpu_uuid": "GPU-1", "ts": 1.0}]], "application/json"),
        ("control.job_logs_report", ["gpu01", 1, "text"], "application/json"),
    ]  # fmt: skip


def test_filesystem_messages_appear_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer never sees a half-written message file: it is renamed into place."""
    from kombu import Connection

    from protocol.broker import FilesystemChannel, install

    install()
    options = {
        "data_folder_in": str(tmp_path),
        "data_folder_out": str(tmp_path),
        "control_folder": str(tmp_path / "control"),
    }
    # kombu remembers declared bindings per process, so a fresh name per test.
    name = f"whole-{uuid.uuid4().hex[:8]}"
    visible_before_rename: list[str] = []
    real_rename = os.rename

    def rename(src: str, dst: str) -> None:
        visible_before_rename.extend(n for n in os.listdir(tmp_path) if n.endswith(f".{name}.msg"))
        assert os.path.getsize(src) > 0  # written completely under the temporary name
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with Connection("filesystem://", transport_options=options) as conn:
        assert isinstance(conn.default_channel, FilesystemChannel)
        queue = conn.SimpleQueue(name)
        queue.put({"n": 1})
        assert visible_before_rename == []
        message = queue.get(timeout=2)
        assert message.payload == {"n": 1}
        message.ack()
        queue.close()


def an_event(job_id: int, kind: str) -> dict[str, Any]:
    return {"event_id": f"{job_id}:{kind}:c{job_id}", "job_id": job_id, "kind": kind}


class Clock:
    """A monotonic clock the test moves by hand (the reporter's backoff reads it)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_job_events_held_by_a_broker_outage_survive_a_restart_of_the_agent_in_order(
    tmp_path: Path,
) -> None:
    broker = RecordingApp()
    broker.fail = True
    reporter = ControlReporter(broker, "gpu01", "tok", outbox_dir=tmp_path / "outbox")
    for job_id in (1, 2):
        reporter.job_event(an_event(job_id, "started"))
    reporter.job_event(an_event(1, "exited"))
    assert reporter.pending_events == 3
    del reporter  # the agent stops (or is killed) while the broker is away

    broker.fail = False
    restarted = ControlReporter(broker, "gpu01", "tok", outbox_dir=tmp_path / "outbox")
    assert restarted.pending_events == 3
    assert restarted.flush_outbox() == 0
    restarted.job_event(an_event(2, "exited"))

    assert [(e["job_id"], e["kind"]) for e in broker.events()] == [
        (1, "started"),
        (2, "started"),
        (1, "exited"),
        (2, "exited"),
    ]
    assert list((tmp_path / "outbox").iterdir()) == []
    # Each went out signed at its try, not when it was first kept.
    for _name, args, _options in broker.sent:
        check(key_from_token("tok"), task=_name, node="gpu01", args=args[2:], envelope=args[1])


def test_the_outbox_backs_off_to_a_cap_and_never_gives_up_on_an_event() -> None:
    from agent.reporter import OUTBOX_BACKOFF_MAX_S

    broker, clock = RecordingApp(), Clock()
    broker.fail = True
    reporter = ControlReporter(broker, "gpu01", "tok", clock=clock)
    reporter.job_event(an_event(7, "exited"))
    attempts = []

    class Counting(RecordingApp):
        def send_task(self, name: str, args: Any = None, **options: Any) -> None:
            attempts.append(clock.now)
            raise ConnectionError("broker unreachable (test)")

    reporter._app = Counting()
    # An hour of outage, looked at every second: far past the node-lost grace.
    for _ in range(3600):
        clock.now += 1
        reporter.flush_outbox()
    gaps = [b - a for a, b in zip(attempts, attempts[1:], strict=False)]
    assert gaps[:5] == [2, 4, 8, 16, 30]
    assert set(gaps[5:]) == {OUTBOX_BACKOFF_MAX_S}
    assert reporter.pending_events == 1

    reporter._app = broker
    broker.fail = False
    clock.now += OUTBOX_BACKOFF_MAX_S
    assert reporter.flush_outbox() == 0
    assert [e["kind"] for e in broker.events()] == ["exited"]


def test_a_heartbeat_that_gets_through_sends_the_held_events_at_once(
    installed_agent: tuple[NodeAgent, RecordingApp, FakeRuntime],
) -> None:
    node_agent, recorder, _runtime = installed_agent
    recorder.fail = True
    node_agent.reporter.job_event(an_event(3, "exited"))
    node_agent.reporter.flush_outbox()  # fails: the next try waits for the backoff

    recorder.fail = False
    assert node_agent.heartbeat_once() is True

    assert [e["kind"] for e in recorder.events()] == ["exited"]
    assert node_agent.reporter.pending_events == 0


def test_heartbeats_are_signed_to_live_minutes_and_job_events_a_day() -> None:
    from protocol.signing import HEARTBEAT_TTL_S, REPORT_TTL_S

    recorder = RecordingApp()
    reporter = ControlReporter(recorder, "gpu01", "tok")
    reporter.heartbeat({"ts": 1.0, "running_job_ids": []})
    reporter.job_event(an_event(1, "exited"))

    lives = [args[1]["exp"] - args[1]["ts"] for _name, args, _ in recorder.sent]
    assert lives == pytest.approx([HEARTBEAT_TTL_S, REPORT_TTL_S])
    assert HEARTBEAT_TTL_S <= 300

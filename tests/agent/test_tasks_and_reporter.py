"""The wire: task names the agent serves, and the messages it sends to the control queue."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agent import tasks
from agent.celery_app import CONTROL_QUEUE, app, configure, node_queue
from agent.gpu import SimulatedBackend
from agent.node import NodeAgent
from agent.reporter import ControlReporter
from tests.agent.support import FakeRuntime, RecordingApp, job_spec


@pytest.fixture
def installed_agent() -> Iterator[tuple[NodeAgent, RecordingApp, FakeRuntime]]:
    recorder, runtime = RecordingApp(), FakeRuntime()
    node_agent = NodeAgent(
        node="gpu01",
        backend=SimulatedBackend(1, node_name="gpu01"),
        runtime=runtime,
        reporter=ControlReporter(recorder, "gpu01", "tok"),
    )
    tasks.set_node_agent(node_agent)
    yield node_agent, recorder, runtime
    tasks.set_node_agent(None)


def test_the_agent_serves_exactly_the_protocols_task_names() -> None:
    served = {name for name in app.tasks if not name.startswith("celery.")}

    assert served == {"agent.start_job", "agent.stop_job", "agent.job_logs"}
    assert node_queue("gpu01") == "node.gpu01"
    assert app.conf.task_serializer == "json" and app.conf.accept_content == ["json"]


def test_a_redelivered_start_job_task_starts_nothing(installed_agent: Any) -> None:
    node_agent, recorder, runtime = installed_agent
    spec = job_spec(5)

    tasks.start_job.apply(args=[spec], task_id="delivery-1")
    tasks.start_job.apply(args=[spec], task_id="delivery-1")
    tasks.stop_job.apply(args=[5, 1, "cancelled"])
    tasks.stop_job.apply(args=[5, 1, "cancelled"])
    tasks.job_logs.apply(args=[5, 10])

    assert len(runtime.jobs) == 1
    assert [e["kind"] for e in recorder.events()] == ["started", "started", "exited"]
    assert len({e["event_id"] for e in recorder.events("started")}) == 1
    assert recorder.args_of("control.job_logs_report") == [["gpu01", "tok", 5, "out\n"]]


def test_tasks_fail_loudly_when_no_agent_is_installed() -> None:
    tasks.set_node_agent(None)
    result = tasks.job_logs.apply(args=[1, 1])

    assert isinstance(result.result, RuntimeError)


def test_reports_reach_the_control_queue_by_name_through_a_real_broker() -> None:
    """kombu's in-memory transport: the same publish path as Redis, minus the server."""
    configure("memory://")
    reporter = ControlReporter(app, "gpu01", "tok")
    event = {"event_id": "1:exited:c1", "job_id": 1, "kind": "exited"}

    reporter.register({"hostname": "h", "gpus": []})
    reporter.heartbeat({"ts": 1.0, "running_job_ids": [1]})
    reporter.job_event(event)
    reporter.samples([{"gpu_uuid": "GPU-1", "ts": 1.0}])
    reporter.job_logs(1, "text")

    received = []
    with app.connection_for_read() as conn, conn.SimpleQueue(CONTROL_QUEUE) as queue:
        for _ in range(5):
            message = queue.get(timeout=2)
            message.ack()
            args, kwargs, _embed = message.payload
            received.append((message.headers["task"], args, message.content_type))
        assert len(queue) == 0
    assert received == [
        ("control.node_register", ["gpu01", "tok", {"hostname": "h", "gpus": []}], "application/json"),
        ("control.node_heartbeat", ["gpu01", "tok", {"ts": 1.0, "running_job_ids": [1]}], "application/json"),
        ("control.job_event", ["gpu01", "tok", event], "application/json"),
        ("control.samples_ingest", ["gpu01", "tok", [{"gpu_uuid": "GPU-1", "ts": 1.0}]], "application/json"),
        ("control.job_logs_report", ["gpu01", "tok", 1, "text"], "application/json"),
    ]  # fmt: skip

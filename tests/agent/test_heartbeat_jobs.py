"""The heartbeat tells the portal which jobs run here and which are still starting
(the portal re-sends a start the node does not acknowledge, and needs to know that a
slow image pull is not a lost start)."""

from __future__ import annotations

from agent.gpu import SimulatedBackend
from agent.node import NodeAgent
from agent.reporter import ControlReporter
from agent.runtime import JobSpec, StartOutcome
from tests.agent.support import FakeRuntime, RecordingApp, job_spec

NODE = "gpu-test"


class HeartbeatDuringStart(FakeRuntime):
    """A runtime that sends a heartbeat while it is "pulling the image" for a start."""

    agent: NodeAgent

    def start(self, spec: JobSpec) -> StartOutcome:
        self.agent.heartbeat_once()
        return super().start(spec)


def test_a_job_being_started_is_reported_as_starting_then_as_running() -> None:
    app, runtime = RecordingApp(), HeartbeatDuringStart()
    backend = SimulatedBackend(1, node_name=NODE)
    agent = NodeAgent(
        node=NODE, backend=backend, runtime=runtime, reporter=ControlReporter(app, NODE, "t")
    )
    runtime.agent = agent
    uuid = backend.discover()[0].uuid

    agent.start_job(job_spec(7, gpu_uuids=[uuid], gpu_indices=[0]))
    agent.heartbeat_once()

    during, after = [args[2] for args in app.args_of("control.node_heartbeat")]
    assert (during["starting_job_ids"], during["running_job_ids"]) == ([7], [])
    assert (after["starting_job_ids"], after["running_job_ids"]) == ([], [7])

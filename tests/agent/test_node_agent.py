"""NodeAgent: what it reports for each task and each change it sees, and that repeats are safe."""

from __future__ import annotations

from typing import Any

import pytest

from agent.gpu import SimulatedBackend
from agent.node import AgentTiming, NodeAgent
from agent.reporter import ControlReporter
from agent.runtime import JobSpec, JobStatus, StartOutcome
from tests.agent.support import FakeRuntime, RecordingApp, job_spec

NODE, TOKEN = "gpu01", "node-token"


@pytest.fixture
def app() -> RecordingApp:
    return RecordingApp()


@pytest.fixture
def runtime() -> FakeRuntime:
    return FakeRuntime()


@pytest.fixture
def backend() -> SimulatedBackend:
    return SimulatedBackend(2, node_name=NODE, seed=1)


@pytest.fixture
def agent(app: RecordingApp, runtime: FakeRuntime, backend: SimulatedBackend) -> NodeAgent:
    return NodeAgent(
        node=NODE,
        backend=backend,
        runtime=runtime,
        reporter=ControlReporter(app, NODE, TOKEN),
        timing=AgentTiming(samples_per_batch=3),
        clock=lambda: 123.0,
    )


def gpu_spec(agent: NodeAgent, job_id: int, **overrides: object) -> dict:
    uuid = agent.backend.discover()[0].uuid
    return job_spec(job_id, gpu_uuids=[uuid], gpu_indices=[0], **overrides)


def test_register_sends_the_node_its_gpus_backend_and_runtime(
    agent: NodeAgent, app: RecordingApp
) -> None:
    agent.register()

    ((node, token, info),) = app.args_of("control.node_register")
    assert (node, token) == (NODE, TOKEN)
    assert info["gpu_backend"] == "simulated" and info["runtime"] == "docker"
    assert info["agent_version"] and info["hostname"]
    assert [g["index"] for g in info["gpus"]] == [0, 1]
    assert set(info["gpus"][0]) == {"uuid", "index", "model", "memory_mb", "kind", "parent_uuid"}
    assert all(options == {"queue": "control"} for _, _, options in app.sent)


def test_start_job_reports_started_once_and_a_second_delivery_starts_nothing(
    agent: NodeAgent, app: RecordingApp, runtime: FakeRuntime, backend: SimulatedBackend
) -> None:
    first = agent.start_job(gpu_spec(agent, 7), delivery_id="task-1")
    second = agent.start_job(gpu_spec(agent, 7), delivery_id="task-1")

    assert first["created"] and not second["created"]
    assert len(runtime.jobs) == 1
    started = app.events("started")
    assert started[0] == {
        "event_id": "7:started:c7",
        "job_id": 7,
        "kind": "started",
        "ts": 100.0,
        "container_id": "c7",
        "exit_code": None,
        "log_tail": "",
        "reason": "",
    }
    # The repeat is the same event, which the portal drops by event_id.
    assert {e["event_id"] for e in started} == {"7:started:c7"}
    assert backend.running_job_ids() == {7}
    assert agent.running_job_ids() == [7]


def test_a_rejected_spec_is_reported_as_start_failed_with_the_reason(
    agent: NodeAgent, app: RecordingApp, runtime: FakeRuntime
) -> None:
    result = agent.start_job(
        job_spec(8, mounts=[{"source": "/data/../etc", "target": "/x"}]), delivery_id="t-8"
    )

    assert not result["ok"] and runtime.starts == 0
    (event,) = app.events("start_failed")
    assert event["event_id"] == "8:start_failed:t-8"
    assert event["container_id"] is None and "contains '..'" in event["reason"]


def test_a_gpu_that_is_not_on_this_node_is_refused(
    agent: NodeAgent, app: RecordingApp, runtime: FakeRuntime
) -> None:
    agent.start_job(job_spec(9, gpu_uuids=["GPU-elsewhere"]), delivery_id="t-9")

    assert runtime.starts == 0
    assert "GPU-elsewhere are not on node gpu01" in app.events("start_failed")[0]["reason"]


def test_a_runtime_failure_is_reported_as_start_failed(
    agent: NodeAgent, app: RecordingApp, runtime: FakeRuntime
) -> None:
    runtime.fail_with = 'exec: "nope": executable file not found'
    agent.start_job(gpu_spec(agent, 10), delivery_id="t-10")

    assert app.events("start_failed")[0]["reason"] == 'exec: "nope": executable file not found'
    assert agent.running_job_ids() == []


def test_an_unexpected_runtime_error_is_reported_too(
    agent: NodeAgent, app: RecordingApp, runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    def engine_down(spec: object) -> None:
        raise ConnectionError("Cannot connect to the Docker daemon")

    monkeypatch.setattr(runtime, "start", engine_down)
    agent.start_job(gpu_spec(agent, 14), delivery_id="t-14")

    (event,) = app.events("start_failed")
    assert event["reason"] == "the container runtime failed: Cannot connect to the Docker daemon"


def test_a_job_that_ends_is_reported_exited_once_with_code_and_log_tail(
    agent: NodeAgent, app: RecordingApp, runtime: FakeRuntime, backend: SimulatedBackend
) -> None:
    agent.start_job(gpu_spec(agent, 11))
    runtime.end(11, 3)

    agent.watch_once()
    agent.watch_once()

    (event,) = app.events("exited")
    assert event["event_id"] == "11:exited:c11"
    assert (event["exit_code"], event["ts"], event["log_tail"]) == (3, 200.0, "out\n")
    assert event["reason"] == ""
    assert backend.running_job_ids() == set() and agent.running_job_ids() == []


def test_an_oom_kill_says_so(agent: NodeAgent, app: RecordingApp, runtime: FakeRuntime) -> None:
    agent.start_job(gpu_spec(agent, 12))
    runtime.end(12, 137, oom_killed=True)
    agent.watch_once()

    assert "out of memory" in app.events("exited")[0]["reason"]


def test_stop_job_reports_the_exit_with_the_portals_reason_and_is_safe_to_repeat(
    agent: NodeAgent, app: RecordingApp
) -> None:
    agent.start_job(gpu_spec(agent, 13))
    agent.stop_job(13, 2, "cancelled by alice")
    agent.stop_job(13, 2, "cancelled by alice")
    missing = agent.stop_job(99, 2, "cancelled")

    (event,) = app.events("exited")
    assert (event["exit_code"], event["reason"]) == (143, "stopped: cancelled by alice")
    assert missing == {"ok": True, "found": False}


def test_reconcile_adopts_running_jobs_and_reports_ended_ones(
    agent: NodeAgent, app: RecordingApp, runtime: FakeRuntime, backend: SimulatedBackend
) -> None:
    uuid = backend.discover()[1].uuid
    runtime.jobs[20] = JobStatus(20, "c20", "running", gpu_uuids=(uuid,))
    runtime.jobs[21] = JobStatus(21, "c21", "exited", exit_code=0, finished_at=50.0)
    runtime.jobs[22] = JobStatus(22, "c22", "created")

    agent.reconcile()

    assert agent.running_job_ids() == [20] and backend.running_job_ids() == {20}
    (exited,) = app.events("exited")
    assert exited["job_id"] == 21 and exited["reason"] == "found ended when the agent started"
    (failed,) = app.events("start_failed")
    assert failed["job_id"] == 22 and 22 not in runtime.jobs
    assert app.events("started") == []


def test_heartbeats_carry_the_running_jobs(agent: NodeAgent, app: RecordingApp) -> None:
    agent.start_job(gpu_spec(agent, 31))
    agent.start_job(gpu_spec(agent, 30))
    agent.heartbeat_once(now=555.0)

    assert app.args_of("control.node_heartbeat") == [
        [NODE, TOKEN, {"ts": 555.0, "running_job_ids": [30, 31], "starting_job_ids": []}]
    ]


def test_samples_go_out_in_batches_with_processes_tied_to_jobs(
    agent: NodeAgent, app: RecordingApp
) -> None:
    agent.start_job(gpu_spec(agent, 40))
    agent.sample_once(now=1.0)
    agent.sample_once(now=6.0)
    assert app.args_of("control.samples_ingest") == []

    agent.sample_once(now=11.0)

    ((node, token, batch),) = app.args_of("control.samples_ingest")
    assert (node, token, len(batch)) == (NODE, TOKEN, 6)  # 3 rounds x 2 GPUs
    assert [s["ts"] for s in batch] == [1.0, 1.0, 6.0, 6.0, 11.0, 11.0]
    busy = batch[-2]
    assert busy["processes"] == [
        {
            "pid": 100_040,
            "used_mb": busy["processes"][0]["used_mb"],
            "container_id": "c40",
            "job_id": 40,
        }
    ]
    assert set(busy) == {
        "gpu_uuid", "ts", "util_pct", "mem_used_mb", "mem_total_mb", "temp_c",
        "power_w", "sm_clock_mhz", "ecc_errors", "xid_errors", "processes",
    }  # fmt: skip


def test_events_survive_a_broker_outage_and_go_out_in_order(
    agent: NodeAgent, app: RecordingApp, runtime: FakeRuntime
) -> None:
    app.fail = True
    agent.start_job(gpu_spec(agent, 50))
    runtime.end(50, 0)
    agent.watch_once()
    assert agent.heartbeat_once() is False
    assert agent.reporter.pending_events == 2

    app.fail = False
    agent.heartbeat_once()

    assert [e["kind"] for e in app.events()] == ["started", "exited"]
    assert agent.reporter.pending_events == 0


def test_samples_are_kept_while_the_broker_is_away(agent: NodeAgent, app: RecordingApp) -> None:
    app.fail = True
    for t in range(3):
        agent.sample_once(now=float(t))
    app.fail = False
    agent.flush_samples()

    assert len(app.args_of("control.samples_ingest")[0][2]) == 6


def test_job_logs_answers_with_a_report(
    agent: NodeAgent, app: RecordingApp, runtime: FakeRuntime
) -> None:
    agent.start_job(gpu_spec(agent, 60))
    agent.job_logs(60, 100)
    agent.job_logs(61, 100)

    reports = app.args_of("control.job_logs_report")
    assert reports[0] == [NODE, TOKEN, 60, "out\n"]
    assert reports[1][2] == 61 and "no container for job 61" in reports[1][3]


def test_ended_containers_are_removed_after_the_retention_period(
    agent: NodeAgent, runtime: FakeRuntime
) -> None:
    agent.start_job(gpu_spec(agent, 70))
    runtime.end(70, 0)
    agent.watch_once()

    agent.cleanup_once(now=200.0 + agent.timing.keep_exited_s - 1)
    assert 70 in runtime.jobs
    agent.cleanup_once(now=200.0 + agent.timing.keep_exited_s + 1)
    assert 70 not in runtime.jobs


class _StartCompletesWhileListing(FakeRuntime):
    """Lists the jobs, then lets a concurrent ``start_job`` finish before the agent goes on.

    That is the moment a real start on another thread may complete: between the
    runtime's listing and whatever the watcher does next.
    """

    def __init__(self) -> None:
        super().__init__()
        self.during_listing: list[Any] = []

    def list_jobs(self) -> list[JobStatus]:
        listed = super().list_jobs()
        while self.during_listing:
            self.during_listing.pop(0)()
        return listed


def test_a_job_that_finishes_starting_during_a_watch_is_not_taken_for_vanished(
    app: RecordingApp, backend: SimulatedBackend
) -> None:
    runtime = _StartCompletesWhileListing()
    agent = NodeAgent(
        node=NODE, backend=backend, runtime=runtime, reporter=ControlReporter(app, NODE, TOKEN)
    )
    runtime.during_listing.append(lambda: agent.start_job(gpu_spec(agent, 7)))

    agent.watch_once()
    agent.watch_once()

    assert app.events("exited") == []
    assert [e["job_id"] for e in app.events("started")] == [7]
    assert agent.running_job_ids() == [7]


def test_a_container_removed_by_hand_is_still_reported_as_vanished(
    agent: NodeAgent, app: RecordingApp, runtime: FakeRuntime
) -> None:
    agent.start_job(gpu_spec(agent, 8))
    runtime.jobs.pop(8)

    agent.watch_once()

    [event] = app.events("exited")
    assert event["job_id"] == 8 and "disappeared" in event["reason"]


def test_an_exit_the_runtime_announces_is_reported_without_a_watch(
    agent: NodeAgent, app: RecordingApp, runtime: FakeRuntime
) -> None:
    agent.start_job(gpu_spec(agent, 9))
    runtime.end(9, 0)

    runtime.announce_exit(9)

    [event] = app.events("exited")
    assert event["job_id"] == 9 and event["exit_code"] == 0


def test_an_announced_exit_is_reported_once_and_lists_no_other_jobs(
    agent: NodeAgent, app: RecordingApp, runtime: FakeRuntime
) -> None:
    # A node keeps a day of ended jobs: an exit must not cost a look at each of them.
    for job_id in (11, 12):
        agent.start_job(gpu_spec(agent, job_id))
    runtime.end(11, 0)
    listings = []
    real_list = runtime.list_jobs

    def counted_list() -> list[JobStatus]:
        listings.append(1)
        return real_list()

    runtime.list_jobs = counted_list  # type: ignore[method-assign]

    runtime.announce_exit(11)
    runtime.announce_exit(11)  # the engine may tell twice
    agent.watch_once()

    assert [e["job_id"] for e in app.events("exited")] == [11]
    assert listings == [1]  # only the watch loop's look
    assert agent.running_job_ids() == [12]


def test_an_exit_announced_while_the_start_is_being_reported_follows_started(
    app: RecordingApp, backend: SimulatedBackend
) -> None:
    runtime = FakeRuntime()
    agent = NodeAgent(
        node=NODE, backend=backend, runtime=runtime, reporter=ControlReporter(app, NODE, TOKEN)
    )
    real_start = runtime.start

    def start_that_ends_at_once(spec: JobSpec) -> StartOutcome:
        outcome = real_start(spec)
        runtime.end(spec.job_id, 3)
        runtime.announce_exit(spec.job_id)  # held back: "started" is not out yet
        return outcome

    runtime.start = start_that_ends_at_once  # type: ignore[method-assign]
    agent.start_job(gpu_spec(agent, 10))

    assert [e["kind"] for e in app.events()] == ["started", "exited"]
    assert app.events("exited")[0]["exit_code"] == 3

"""The agent streams each job's whole output while it runs (local-process runtime)."""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

from agent.gpu import SimulatedBackend
from agent.logstream import LogStreamer
from agent.node import NodeAgent
from agent.reporter import ControlReporter
from agent.runtime import JobSpec
from agent.runtime.local import LocalProcessRuntime
from agent.runtime.output import skip_bytes
from tests.agent.support import RecordingApp, job_spec, wait_until


def spec(job_id: int, script: str) -> JobSpec:
    return JobSpec.from_wire(job_spec(job_id, command=["sh", "-c", script]))


def chunks(app: RecordingApp) -> list[dict[str, Any]]:
    return [args[2] for args in app.args_of("control.job_log_chunk")]


def output(sent: list[dict[str, Any]]) -> bytes:
    """What the portal would store: each byte once, by offset."""
    data = bytearray()
    for chunk in sorted(sent, key=lambda c: c["offset"]):
        piece = base64.b64decode(chunk["data"])
        data[chunk["offset"] : chunk["offset"] + len(piece)] = piece
    return bytes(data)


def agent_on(tmp_path: Path, app: RecordingApp) -> NodeAgent:
    runtime = LocalProcessRuntime(tmp_path, enabled=True)
    return NodeAgent(
        node="n1",
        backend=SimulatedBackend(1, node_name="n1"),
        runtime=runtime,
        reporter=ControlReporter(app, "n1", "tok"),
        log_state_dir=tmp_path / "log-offsets",
    )


def test_a_jobs_whole_output_is_sent_in_bounded_chunks_before_its_end_event(
    tmp_path: Path,
) -> None:
    app = RecordingApp()
    node_agent = agent_on(tmp_path, app)
    script = "i=0; while [ $i -lt 20000 ]; do echo line $i; i=$((i+1)); done"
    node_agent.start_job(job_spec(7, command=["sh", "-c", script]))
    wait_until(lambda: app.events("exited"), timeout_s=30)
    sent = chunks(app)
    expected = "".join(f"line {i}\n" for i in range(20000)).encode()
    assert output(sent) == expected
    assert all(len(base64.b64decode(c["data"])) <= 256 * 1024 for c in sent)
    assert sent[-1]["final"] and sum(c["final"] for c in sent) == 1
    # The last chunk went out before the end event.
    names = [name for name, _args, _opts in app.sent]
    last_chunk = max(i for i, n in enumerate(names) if n == "control.job_log_chunk")
    exited_at = next(
        i
        for i, (n, args, _o) in enumerate(app.sent)
        if n == "control.job_event" and args[2]["kind"] == "exited"
    )
    assert last_chunk < exited_at


def test_output_is_sent_while_the_job_runs(tmp_path: Path) -> None:
    app = RecordingApp()
    node_agent = agent_on(tmp_path, app)
    node_agent.start_job(job_spec(8, command=["sh", "-c", "echo early; sleep 30"]))
    try:
        wait_until(lambda: output(chunks(app)) == b"early\n", timeout_s=10)
        assert not app.events("exited")
    finally:
        node_agent.stop_job(8, 0, "test over")


def test_a_broker_outage_delays_the_log_and_loses_nothing(tmp_path: Path) -> None:
    app = RecordingApp()
    app.fail = True
    node_agent = agent_on(tmp_path, app)
    node_agent.start_job(job_spec(9, command=["sh", "-c", "echo one; sleep 1; echo two"]))
    wait_until(lambda: (tmp_path / "local-jobs" / "9" / "exit_code").read_text().strip(), 10)
    app.fail = False
    wait_until(lambda: any(c["final"] for c in chunks(app)), timeout_s=40)
    assert output(chunks(app)) == b"one\ntwo\n"


def test_a_restarted_agent_resumes_from_the_offset_it_kept(tmp_path: Path) -> None:
    runtime = LocalProcessRuntime(tmp_path, enabled=True)
    runtime.start(spec(11, "echo first; sleep 1; echo second"))
    status = runtime.job_status(11)
    assert status is not None
    first = RecordingApp()
    streamer = LogStreamer(
        runtime, ControlReporter(first, "n1", "tok").job_log_chunk, state_dir=tmp_path / "o"
    )
    streamer.follow(11, status.container_id)
    wait_until(lambda: output(chunks(first)) == b"first\n", timeout_s=10)
    streamer.stop()  # the agent stops; the job runs on
    second = RecordingApp()
    again = LogStreamer(
        LocalProcessRuntime(tmp_path, enabled=True),
        ControlReporter(second, "n1", "tok").job_log_chunk,
        state_dir=tmp_path / "o",
    )
    assert again.drain(11, status.container_id, timeout_s=20)
    resent = chunks(second)
    assert resent[0]["offset"] == len(b"first\n")
    assert output(chunks(first) + resent) == b"first\nsecond\n"


def test_an_ended_jobs_end_is_not_held_back_while_the_broker_refuses_its_log(
    tmp_path: Path,
) -> None:
    runtime = LocalProcessRuntime(tmp_path, enabled=True)
    runtime.start(spec(12, "echo last words"))
    status = runtime.job_status(12)
    assert status is not None
    wait_until(lambda: not runtime.job_status(12).running, timeout_s=10)  # type: ignore[union-attr]
    app = RecordingApp()
    app.fail = True
    streamer = LogStreamer(runtime, ControlReporter(app, "n1", "tok").job_log_chunk)
    started = time.monotonic()
    # Not sent: the end event goes on at once (to its own outbox), not after the timeout.
    assert not streamer.drain(12, status.container_id, timeout_s=120)
    assert time.monotonic() - started < 60
    app.fail = False
    # The stream's thread kept trying: the output arrives once the broker is back.
    wait_until(lambda: any(c["final"] for c in chunks(app)), timeout_s=40)
    assert output(chunks(app)) == b"last words\n"
    streamer.stop()


def test_skip_bytes_drops_exactly_what_was_sent_before() -> None:
    assert b"".join(skip_bytes(iter([b"abc", b"", b"defg", b"h"]), 5)) == b"fgh"

"""The demo's local-process runtime: process groups, grace, logs, restarts."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from agent.runtime import JobSpec, RuntimeStartError, RuntimeUnavailable
from agent.runtime.local import LocalProcessRuntime
from tests.agent.support import job_spec, logs_of, proc_state, wait_until

TRAP_TERM = 'trap "echo bye; exit 0" TERM; echo ready; while true; do sleep 0.1; done'


def spec(job_id: int, script: str, **overrides: object) -> JobSpec:
    return JobSpec.from_wire(job_spec(job_id, command=["sh", "-c", script], **overrides))


@pytest.fixture
def runtime(tmp_path: Path) -> LocalProcessRuntime:
    return LocalProcessRuntime(tmp_path, enabled=True)


def exited(runtime: LocalProcessRuntime, job_id: int) -> Any:
    status = next(s for s in runtime.list_jobs() if s.job_id == job_id)
    return status if status.state == "exited" else None


def test_it_refuses_to_exist_unless_enabled_on_purpose(tmp_path: Path) -> None:
    with pytest.raises(RuntimeUnavailable, match="LABPORTAL_ALLOW_LOCAL_RUNTIME=1"):
        LocalProcessRuntime(tmp_path)


def test_a_job_runs_in_its_own_process_group_with_its_gpus_and_a_clean_env(
    runtime: LocalProcessRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LABPORTAL_NODE_TOKEN", "secret-token")
    script = (
        'echo "cuda=$CUDA_VISIBLE_DEVICES greeting=$GREETING token=${LABPORTAL_NODE_TOKEN:-none}"; '
        "echo pgid=$(ps -o pgid= -p $$ 2>/dev/null || cut -d' ' -f5 /proc/$$/stat)"
    )
    outcome = runtime.start(spec(1, script, gpu_uuids=["GPU-a", "GPU-b"], gpu_indices=[0, 1]))

    status = wait_until(lambda: exited(runtime, 1))
    logs = logs_of(runtime, 1, 10)
    assert outcome.created and status.exit_code == 0
    assert "cuda=GPU-a,GPU-b greeting=hi token=none" in logs
    pgid = int(logs.split("pgid=")[1].split()[0])
    assert pgid != os.getpgid(0)  # not the agent's group: a stop cannot hit the agent
    assert status.gpu_uuids == ("GPU-a", "GPU-b")


def test_a_second_start_of_the_same_job_starts_nothing(runtime: LocalProcessRuntime) -> None:
    first = runtime.start(spec(2, "sleep 30"))
    second = runtime.start(spec(2, "sleep 30"))

    assert first.created and not second.created
    assert second.container_id == first.container_id
    assert [s.job_id for s in runtime.list_jobs() if s.running] == [2]
    runtime.stop(2, 0)


def test_a_requeued_job_runs_again_under_its_next_attempt(runtime: LocalProcessRuntime) -> None:
    first = runtime.start(spec(3, "echo first"))
    wait_until(lambda: exited(runtime, 3))
    assert not runtime.start(spec(3, "echo first")).created

    second = runtime.start(spec(3, "echo second", attempt=1))

    assert second.created and second.container_id != first.container_id
    wait_until(lambda: exited(runtime, 3))
    assert runtime.logs(3, 5) == "second\n"


def test_stop_sends_sigterm_and_a_job_that_handles_it_exits_cleanly(
    runtime: LocalProcessRuntime,
) -> None:
    runtime.start(spec(3, TRAP_TERM))
    wait_until(lambda: "ready" in logs_of(runtime, 3, 5))

    began = time.monotonic()
    status = runtime.stop(3, grace_s=5)

    assert status is not None and status.state == "exited" and status.exit_code == 0
    assert time.monotonic() - began < 4  # it ended on SIGTERM, not at the deadline
    assert logs_of(runtime, 3, 5).strip().endswith("bye")


def test_stop_kills_a_job_that_ignores_sigterm_after_the_grace_period(
    runtime: LocalProcessRuntime,
) -> None:
    runtime.start(spec(4, 'trap "" TERM; echo ready; while true; do sleep 0.1; done'))
    wait_until(lambda: "ready" in logs_of(runtime, 4, 5))

    began = time.monotonic()
    status = runtime.stop(4, grace_s=0.3)

    assert time.monotonic() - began >= 0.3
    assert status is not None and status.exit_code == 137  # 128 + SIGKILL
    assert runtime.stop(4, grace_s=1) == status  # stopping again changes nothing


def test_logs_return_the_last_lines(runtime: LocalProcessRuntime) -> None:
    runtime.start(spec(5, "for i in 1 2 3 4 5; do echo line$i; done"))
    wait_until(lambda: exited(runtime, 5))

    assert runtime.logs(5, 2) == "line4\nline5\n"
    assert runtime.logs(99, 2) is None


def test_a_restarted_agent_finds_running_jobs_and_the_exit_code_of_ended_ones(
    tmp_path: Path,
) -> None:
    before = LocalProcessRuntime(tmp_path, enabled=True)
    before.start(spec(6, "sleep 30"))
    before.start(spec(7, "echo done; exit 3"))
    wait_until(lambda: (tmp_path / "local-jobs" / "7" / "exit_code").read_text())
    # The wrapper writes the exit code just before it exits: wait for the exit
    # itself (a zombie, since ``before`` never reaps it), or the job still runs.
    wrapper = json.loads((tmp_path / "local-jobs" / "7" / "meta.json").read_text())["pid"]
    wait_until(lambda: proc_state(wrapper) in ("Z", None))

    after = LocalProcessRuntime(tmp_path, enabled=True)  # no Popen handles: a new process
    found = {s.job_id: s for s in after.list_jobs()}

    assert found[6].running
    assert found[7].state == "exited" and found[7].exit_code == 3
    stopped = after.stop(6, 1)
    assert stopped is not None and stopped.state == "exited"
    assert not after.start(spec(7, "echo again")).created


def test_job_for_pid_finds_the_job_of_any_process_in_its_group(
    runtime: LocalProcessRuntime,
) -> None:
    outcome = runtime.start(spec(8, "sleep 30 & echo child=$!; wait"))
    logs = wait_until(lambda: "child=" in logs_of(runtime, 8, 5) and logs_of(runtime, 8, 5))
    child = int(logs.split("child=")[1].split()[0])

    owner = runtime.job_for_pid(child)
    assert owner is not None and owner.container_id == outcome.container_id
    assert runtime.job_for_pid(os.getpid()) is None
    runtime.stop(8, 0)


def test_a_command_that_cannot_be_empty_is_refused(runtime: LocalProcessRuntime) -> None:
    with pytest.raises(RuntimeStartError, match="needs a command"):
        runtime.start(JobSpec.from_wire(job_spec(9, command=[])))


def test_remove_forgets_an_ended_job(runtime: LocalProcessRuntime) -> None:
    runtime.start(spec(10, "true"))
    wait_until(lambda: exited(runtime, 10))
    runtime.remove(10)

    assert runtime.list_jobs() == []


def test_the_runtime_announces_an_exit_once_the_process_has_ended(
    runtime: LocalProcessRuntime,
) -> None:
    ended: list[tuple[int, str | None]] = []

    def record(job_id: int) -> None:
        status = exited(runtime, job_id)
        ended.append((job_id, status.state if status else None))

    runtime.on_exit(record)
    runtime.start(spec(21, "exit 4"))

    # Announced by the runtime's waiter thread; nobody lists the jobs meanwhile.
    wait_until(lambda: ended)
    assert ended == [(21, "exited")]
    status = exited(runtime, 21)
    assert status is not None and status.exit_code == 4


def test_an_agent_on_the_local_runtime_reports_an_exit_without_its_watch_loop(
    runtime: LocalProcessRuntime,
) -> None:
    from agent.gpu import SimulatedBackend
    from agent.node import NodeAgent
    from agent.reporter import ControlReporter
    from tests.agent.support import RecordingApp

    app = RecordingApp()
    agent = NodeAgent(
        node="n1",
        backend=SimulatedBackend(1, node_name="n1", seed=1),
        runtime=runtime,
        reporter=ControlReporter(app, "n1", "token"),
    )
    agent.start_job(job_spec(22, command=["sh", "-c", "exit 5"]))

    event = wait_until(lambda: app.events("exited"))[0]
    assert (event["job_id"], event["exit_code"]) == (22, 5)
    assert [e["kind"] for e in app.events()] == ["started", "exited"]


def test_closing_the_runtime_stops_the_whole_process_group_of_running_jobs(
    runtime: LocalProcessRuntime,
) -> None:
    # What Ctrl-C on the demo does: the agent closes its runtime on the way out.
    runtime.start(spec(40, "sleep 60 & sleep 60; wait"))
    pgid = wait_until(lambda: runtime._meta(40))["pid"]
    runtime.close()
    assert exited(runtime, 40) is not None
    assert _live_members_of_group(pgid) == []


def _live_members_of_group(pgid: int) -> list[int]:
    """Pids in the process group that are not zombies (a zombie awaits only its reaping)."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            live.append(int(stat.parent.name))
    return live


def test_a_shell_form_command_runs_as_typed(runtime: LocalProcessRuntime) -> None:
    runtime.start(JobSpec.from_wire(job_spec(41, command=["/bin/sh", "-c", "sleep 0; echo done"])))
    status = wait_until(lambda: exited(runtime, 41))
    assert status.exit_code == 0
    assert "done" in logs_of(runtime, 41, 10)


def test_an_ended_job_read_once_is_read_again_when_its_directory_is_replaced(
    tmp_path: Path,
) -> None:
    """Ended jobs are not re-read at every listing, yet a new run in their place is seen."""
    runtime = LocalProcessRuntime(tmp_path, enabled=True)
    runtime.start(spec(8, "exit 3"))
    assert wait_until(lambda: exited(runtime, 8)).exit_code == 3
    # Another agent process on the same state directory (a restart) runs the next attempt.
    other = LocalProcessRuntime(tmp_path, enabled=True)
    other.start(spec(8, "sleep 30", attempt=2))
    try:
        status = next(s for s in runtime.list_jobs() if s.job_id == 8)
        assert status.state == "running"
    finally:
        other.stop(8, 0)


def test_a_job_whose_wrapper_ended_before_it_was_recorded_keeps_its_identity(
    runtime: LocalProcessRuntime, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A job that ends at once, on a loaded node: the wrapper has exited (unreaped)
    # by the time the runtime records its start time. The leftover it put in the
    # background is still the job's, and a restarted agent does not see it running.
    spawn = LocalProcessRuntime._spawn

    def spawn_then_lose_the_cpu(self: LocalProcessRuntime, spec: Any, job_dir: Any) -> Any:
        proc = spawn(self, spec, job_dir)
        wait_until(lambda: proc_state(proc.pid) == "Z")
        return proc

    monkeypatch.setattr(LocalProcessRuntime, "_spawn", spawn_then_lose_the_cpu)
    runtime.start(spec(11, 'sleep 300 & echo "child=$!"; exit 0'))
    logs = wait_until(lambda: "child=" in logs_of(runtime, 11, 5) and logs_of(runtime, 11, 5))
    child = int(logs.split("child=")[1].split()[0])
    wait_until(lambda: exited(runtime, 11))

    after = LocalProcessRuntime(tmp_path, enabled=True)
    assert [s.state for s in after.list_jobs()] == ["exited"]
    try:
        assert runtime.kill_leftovers(11) == [child]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_a_job_recorded_without_a_start_time_is_neither_running_nor_cleaned_up(
    runtime: LocalProcessRuntime, tmp_path: Path
) -> None:
    # State an older agent left: no start time, so its pid cannot be told from a reuse.
    runtime.start(spec(12, "sleep 30"))
    meta_path = tmp_path / "local-jobs" / "12" / "meta.json"
    meta = json.loads(meta_path.read_text())
    try:
        meta["start_ticks"] = None
        meta_path.write_text(json.dumps(meta))

        after = LocalProcessRuntime(tmp_path, enabled=True)
        assert after.kill_leftovers(12) == []
        assert os.getpgid(meta["pid"]) == meta["pid"]  # untouched
    finally:
        runtime.stop(12, 0)


def test_a_start_time_an_earlier_agent_read_from_proc_still_identifies_the_job(
    runtime: LocalProcessRuntime, tmp_path: Path
) -> None:
    # Earlier agents stored the start time as /proc/PID/stat's starttime field (clock
    # ticks since boot); this one asks psutil. Their state files must keep working.
    runtime.start(spec(13, "sleep 30"))
    meta = runtime._meta(13)
    assert meta is not None
    stat = Path(f"/proc/{meta['pid']}/stat").read_text()
    since_boot = int(stat[stat.rindex(")") + 2 :].split()[19])
    after = LocalProcessRuntime(tmp_path, enabled=True)
    try:
        assert meta["start_ticks"] == since_boot
        status = after.job_status(13)
        assert status is not None and status.state == "running"
    finally:
        runtime.stop(13, 0)

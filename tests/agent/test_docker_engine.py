"""Against the real Docker engine: hardening, stop with grace, logs, reconcile.

Uses the offline image built by ``bash .ci/docker-setup.sh``. Jobs here have
no GPUs (there is no NVIDIA runtime), so they carry no device request; the
request itself is checked in test_docker_requests.py.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent.runtime import JobSpec
from agent.runtime.docker_runtime import DockerRuntime
from tests.agent.support import job_spec, logs_of, make_agent, wait_until

pytestmark = pytest.mark.docker

TRAP_TERM = 'trap "echo bye; exit 0" TERM; echo ready; while true; do sleep 1; done'


def test_a_job_container_is_hardened_as_docker_inspect_shows(
    docker_runtime: DockerRuntime, docker_client: Any, tmp_path: Path
) -> None:
    data_dir = tmp_path / "alice"
    data_dir.mkdir()
    (data_dir / "input.txt").write_text("payload")
    spec = JobSpec.from_wire(
        job_spec(
            101,
            command=["sh", "-c", "id; cat /data/input.txt; echo; sleep 30"],
            cpus=0.5,
            memory_mb=64,
            pids_limit=32,
            mounts=[{"source": str(data_dir), "target": "/data", "read_only": True}],
        ),
        allowed_mount_roots=[str(tmp_path)],
    )

    outcome = docker_runtime.start(spec)
    attrs = docker_client.api.inspect_container(outcome.container_id)
    host, config = attrs["HostConfig"], attrs["Config"]

    assert host["Privileged"] is False
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
    assert host["SecurityOpt"] == ["no-new-privileges:true"]
    assert host["PidsLimit"] == 32
    assert host["Memory"] == 64 * 1024 * 1024 and host["MemorySwap"] == 64 * 1024 * 1024
    assert host["NanoCpus"] == 500_000_000
    assert config["User"] == "1234:2345"
    assert {k: v for k, v in config["Labels"].items() if k.startswith("labportal.")} == {
        "labportal.job_id": "101",
        "labportal.node": docker_runtime._node,
        "labportal.user": "alice",
        "labportal.managed": "true",
        "labportal.gpu_uuids": "",
        "labportal.attempt": "0",
    }
    # Only the spec's mount, read-only, and no other way in from the host.
    assert not host["Binds"]
    assert [(m["Type"], m["Source"], m["Destination"], m["RW"]) for m in attrs["Mounts"]] == [
        ("bind", str(data_dir), "/data", False)
    ]
    assert not host.get("DeviceRequests")
    assert host["NetworkMode"] == "none" and host["PidMode"] != "host"
    assert host["ReadonlyRootfs"] is True and "/tmp" in host["Tmpfs"]
    # And inside, the job really is the member's uid with the mounted file.
    logs = wait_until(
        lambda: "payload" in logs_of(docker_runtime, 101, 10) and logs_of(docker_runtime, 101, 10)
    )
    assert "uid=1234 gid=2345" in logs


def test_a_job_asking_for_more_cpus_than_the_node_has_gets_them_all_and_runs(
    docker_runtime: Any, docker_client: Any
) -> None:
    # The engine refuses --cpus above its own count ("Range of CPUs is from 0.01 to N"):
    # a queue's default of many CPUs on a small server would never start.
    ncpu = docker_client.info()["NCPU"]
    spec = JobSpec.from_wire(job_spec(102, command=["sh", "-c", "sleep 30"], cpus=ncpu + 62))

    outcome = docker_runtime.start(spec)

    host = docker_client.api.inspect_container(outcome.container_id)["HostConfig"]
    assert host["NanoCpus"] == ncpu * 1_000_000_000
    assert outcome.status.running


def test_a_mount_that_could_escape_is_refused_and_nothing_is_created(
    docker_runtime: DockerRuntime, docker_client: Any, node_name: str
) -> None:
    node_agent, app = make_agent(docker_runtime, node_name)

    node_agent.start_job(
        job_spec(102, mounts=[{"source": "/srv/../etc", "target": "/x", "read_only": True}]),
        delivery_id="d-102",
    )

    (event,) = app.events("start_failed")
    assert "contains '..'" in event["reason"]
    assert docker_runtime.list_jobs() == []


def test_an_image_that_cannot_be_had_fails_to_start_and_leaves_no_container(
    docker_runtime: DockerRuntime, node_name: str
) -> None:
    node_agent, app = make_agent(docker_runtime, node_name)

    node_agent.start_job(job_spec(103, image="labportal/absent:never"), delivery_id="d-103")

    (event,) = app.events("start_failed")
    assert "labportal/absent:never" in event["reason"] and "could not be pulled" in event["reason"]
    assert docker_runtime.list_jobs() == []


def test_a_missing_program_ends_the_job_with_127_and_says_why_in_the_log_tail(
    docker_runtime: DockerRuntime, node_name: str
) -> None:
    # The init process (PID 1) starts fine and then fails to exec the command,
    # so this is an exit, not a start failure.
    node_agent, app = make_agent(docker_runtime, node_name)
    node_agent.start_job(job_spec(111, command=["/no/such/program"]))

    def reported() -> bool:
        node_agent.watch_once()
        return bool(app.events("exited"))

    wait_until(reported, poll_s=0.1)
    (event,) = app.events("exited")
    assert event["exit_code"] == 127
    assert "/no/such/program" in event["log_tail"]


def test_the_engine_tells_the_agent_of_an_exit_without_the_watch_loop(
    docker_runtime: DockerRuntime, node_name: str
) -> None:
    node_agent, app = make_agent(docker_runtime, node_name)
    node_agent.start_job(job_spec(112, command=["sh", "-c", "sleep 1; echo done; exit 3"]))
    assert app.events("started")

    # Nobody calls watch_once here: only the engine's "die" event can bring the exit.
    wait_until(lambda: app.events("exited"), timeout_s=30)

    (event,) = app.events("exited")
    assert event["job_id"] == 112 and event["exit_code"] == 3
    assert "done" in event["log_tail"]
    assert node_agent.running_job_ids() == []


def test_stop_gives_a_job_that_traps_sigterm_its_grace_and_it_exits_cleanly(
    docker_runtime: DockerRuntime,
) -> None:
    docker_runtime.start(JobSpec.from_wire(job_spec(104, command=["sh", "-c", TRAP_TERM])))
    wait_until(lambda: "ready" in logs_of(docker_runtime, 104, 5))

    began = time.monotonic()
    status = docker_runtime.stop(104, grace_s=2)

    assert status is not None and status.state == "exited"
    assert status.exit_code == 0 and not status.oom_killed
    assert time.monotonic() - began < 2  # ended on SIGTERM, before the kill deadline
    assert logs_of(docker_runtime, 104, 5).strip().endswith("bye")


def test_stop_kills_a_job_that_ignores_sigterm_once_the_grace_is_over(
    docker_runtime: DockerRuntime,
) -> None:
    script = 'trap "" TERM; echo ready; while true; do sleep 1; done'
    docker_runtime.start(JobSpec.from_wire(job_spec(105, command=["sh", "-c", script])))
    wait_until(lambda: "ready" in logs_of(docker_runtime, 105, 5))

    status = docker_runtime.stop(105, grace_s=1)

    assert status is not None and status.exit_code == 137


def test_logs_tail_and_a_second_start_starts_nothing(
    docker_runtime: DockerRuntime, docker_client: Any, node_name: str
) -> None:
    spec = JobSpec.from_wire(
        job_spec(106, command=["sh", "-c", "for i in 1 2 3 4; do echo line$i; done; sleep 30"])
    )
    first = docker_runtime.start(spec)
    second = docker_runtime.start(spec)

    assert first.created and not second.created
    assert second.container_id == first.container_id
    assert (
        len(
            docker_client.containers.list(
                all=True, filters={"label": f"labportal.node={node_name}"}
            )
        )
        == 1
    )
    assert wait_until(lambda: docker_runtime.logs(106, 2) == "line3\nline4\n")


def test_a_requeued_job_starts_again_under_its_next_attempt(
    docker_runtime: DockerRuntime, docker_client: Any, node_name: str
) -> None:
    first = docker_runtime.start(
        JobSpec.from_wire(job_spec(107, command=["sh", "-c", "echo first"]))
    )
    assert wait_until(
        lambda: any(j.job_id == 107 and not j.running for j in docker_runtime.list_jobs())
    )
    again = docker_runtime.start(
        JobSpec.from_wire(job_spec(107, command=["sh", "-c", "echo first"]))
    )
    assert not again.created  # the same attempt delivered twice starts nothing

    second = docker_runtime.start(
        JobSpec.from_wire(job_spec(107, attempt=1, command=["sh", "-c", "echo second; sleep 30"]))
    )

    assert second.created and second.container_id != first.container_id
    containers = docker_client.containers.list(
        all=True, filters={"label": ["labportal.job_id=107", f"labportal.node={node_name}"]}
    )
    assert [c.labels["labportal.attempt"] for c in containers] == ["1"]
    assert wait_until(lambda: docker_runtime.logs(107, 5) == "second\n")


def test_a_restarted_agent_reattaches_to_running_jobs_and_reports_ended_ones(
    docker_client: Any, docker_runtime: DockerRuntime, node_name: str
) -> None:
    before, _ = make_agent(docker_runtime, node_name)
    before.start_job(job_spec(107, command=["sh", "-c", TRAP_TERM]))
    before.start_job(job_spec(108, command=["sh", "-c", "echo finished; exit 7"]))
    # The first agent dies here; job 108 ends while no agent watches.
    wait_until(
        lambda: any(s.job_id == 108 and s.state == "exited" for s in docker_runtime.list_jobs())
    )

    after, app = make_agent(DockerRuntime(node_name, client=docker_client), node_name)
    after.reconcile()
    after.heartbeat_once(now=1.0)

    (ended,) = app.events("exited")
    assert (ended["job_id"], ended["exit_code"]) == (108, 7)
    assert "finished" in ended["log_tail"]
    assert ended["event_id"].startswith("108:exited:")
    assert after.running_job_ids() == [107]
    assert app.args_of("control.node_heartbeat")[0][2]["running_job_ids"] == [107]

    after.stop_job(107, 2, "cancelled by alice")

    stopped = app.events("exited")[-1]
    assert (stopped["job_id"], stopped["exit_code"]) == (107, 0)
    assert stopped["reason"] == "stopped: cancelled by alice"
    assert "bye" in stopped["log_tail"]


def test_the_watcher_reports_a_job_that_ends_while_the_agent_runs(
    docker_runtime: DockerRuntime, node_name: str
) -> None:
    node_agent, app = make_agent(docker_runtime, node_name)
    node_agent.start_job(job_spec(109, command=["sh", "-c", "sleep 0.3; exit 4"]))

    def reported() -> bool:
        node_agent.watch_once()
        return bool(app.events("exited"))

    wait_until(reported, poll_s=0.1)
    (event,) = app.events("exited")
    assert event["exit_code"] == 4 and event["job_id"] == 109
    node_agent.watch_once()
    assert len(app.events("exited")) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="reading another uid's file needs root to set up")
def test_a_job_writes_files_on_its_mount_as_the_member(
    docker_runtime: DockerRuntime, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    os.chown(out, 1234, 2345)
    docker_runtime.start(
        JobSpec.from_wire(
            job_spec(
                110,
                command=["sh", "-c", "echo result > /out/result.txt"],
                mounts=[{"source": str(out), "target": "/out", "read_only": False}],
            ),
            allowed_mount_roots=[str(tmp_path)],
        )
    )
    wait_until(lambda: (out / "result.txt").exists() and (out / "result.txt").read_text())

    stat = (out / "result.txt").stat()
    assert (stat.st_uid, stat.st_gid) == (1234, 2345)


def _host_listener() -> tuple[socket.socket, int]:
    """A TCP listener on every host address, as the broker would be on a GPU server."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", 0))
    listener.listen(8)

    def answer_and_hang_up() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                conn.close()

    threading.Thread(target=answer_and_hang_up, daemon=True).start()
    return listener, listener.getsockname()[1]


# Tries the default bridge's gateway and the job network's own gateway.
PROBE = (
    "for gw in $(busybox ip route 2>/dev/null | busybox awk '/default/ {{print $3}}') 172.17.0.1; do "
    "if echo x | busybox nc -w 3 $gw {port} >/dev/null 2>&1; then echo REACHED $gw; fi; done; "
    "echo PROBE-DONE"
)


def test_a_job_container_has_no_route_to_the_host_or_the_broker(
    docker_runtime: DockerRuntime, docker_client: Any
) -> None:
    listener, port = _host_listener()
    try:
        spec = JobSpec.from_wire(job_spec(111, command=["sh", "-c", PROBE.format(port=port)]))
        outcome = docker_runtime.start(spec)
        logs = wait_until(
            lambda: (
                "PROBE-DONE" in logs_of(docker_runtime, 111, 20)
                and logs_of(docker_runtime, 111, 20)
            ),
            timeout_s=30,
        )
        attrs = docker_client.api.inspect_container(outcome.container_id)
        assert attrs["HostConfig"]["NetworkMode"] == "none"
        assert "REACHED" not in logs
    finally:
        listener.close()


def test_a_queue_with_egress_gives_each_job_its_own_network_with_a_route_out(
    docker_runtime: DockerRuntime, docker_client: Any
) -> None:
    """The positive control of the test above: the same probe does reach the host here."""
    listener, port = _host_listener()
    try:
        spec = JobSpec.from_wire(
            job_spec(112, network="egress", command=["sh", "-c", PROBE.format(port=port)])
        )
        outcome = docker_runtime.start(spec)
        logs = wait_until(
            lambda: (
                "PROBE-DONE" in logs_of(docker_runtime, 112, 20)
                and logs_of(docker_runtime, 112, 20)
            ),
            timeout_s=30,
        )
        attrs = docker_client.api.inspect_container(outcome.container_id)
        assert list(attrs["NetworkSettings"]["Networks"]) == [docker_runtime.network_name(112)]
        assert "REACHED" in logs
    finally:
        listener.close()
    docker_runtime.remove(112)
    assert not docker_client.networks.list(names=[docker_runtime.network_name(112)])


def test_a_job_writes_only_to_tmp_and_its_mounts_and_runs_what_it_wrote_to_tmp(
    docker_runtime: DockerRuntime,
) -> None:
    # /tmp is $HOME: compilers' caches (torch.compile's) build and run code there.
    script = (
        "touch /etc/evil 2>/dev/null && echo ROOT-WRITABLE; "
        "touch /tmp/scratch && echo TMP-OK; "
        "printf '#!/bin/sh\\necho BUILT-AND-RAN\\n' > /tmp/built.sh && chmod +x /tmp/built.sh; "
        "/tmp/built.sh; echo DONE"
    )
    docker_runtime.start(JobSpec.from_wire(job_spec(113, command=["sh", "-c", script])))
    logs = wait_until(
        lambda: "DONE" in logs_of(docker_runtime, 113, 20) and logs_of(docker_runtime, 113, 20)
    )
    assert "TMP-OK" in logs and "ROOT-WRITABLE" not in logs
    assert "BUILT-AND-RAN" in logs, logs

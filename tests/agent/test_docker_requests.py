"""What the docker SDK sends to the engine, captured at its low-level API.

There is no NVIDIA runtime on test machines, so the GPU device request is
checked here, on the exact ``create_container`` call, rather than on a
running container.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import docker
import pytest

from agent.runtime import JobSpec
from agent.runtime.docker_runtime import DockerRuntime, parse_docker_time
from tests.agent.support import job_spec

UUIDS = ["GPU-5f0c3a1e-0000-1111-2222-333344445555", "MIG-8d2b7c4f-aaaa-bbbb-cccc-ddddeeeeffff"]


class _Response:
    def __init__(self, body: dict[str, Any]) -> None:
        self._body = body

    def raise_for_status(self) -> None:
        return None

    def json(self) -> dict[str, Any]:
        return self._body


class CapturingApi:
    """Replaces the SDK's HTTP layer: records the JSON body of ``POST /containers/create``."""

    def __init__(self, api: docker.APIClient) -> None:
        self.created: list[dict[str, Any]] = []
        self._api = api

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        api = self._api
        monkeypatch.setattr(api, "containers", lambda **kw: [])
        monkeypatch.setattr(api, "_post_json", self.post_json)
        monkeypatch.setattr(api, "start", lambda *a, **kw: None)
        monkeypatch.setattr(api, "inspect_container", self.inspect_container)

    def post_json(self, url: str, data: dict[str, Any], params: Any = None) -> _Response:
        assert url.endswith("/containers/create"), url
        # Round-trip through JSON: exactly what would go over the socket.
        self.created.append({**json.loads(json.dumps(data)), "name": params["name"]})
        return _Response({"Id": "f" * 64})

    def inspect_container(self, container: str) -> dict[str, Any]:
        labels = self.created[-1]["Labels"]
        return {
            "Id": "f" * 64,
            "Config": {"Labels": labels},
            "State": {"Status": "running", "StartedAt": "2025-01-02T03:04:05.123456789Z"},
        }


@pytest.fixture
def offline_client() -> docker.DockerClient:
    # A pinned API version means the SDK never contacts an engine to negotiate one.
    return docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.41")


def start(
    client: docker.DockerClient,
    monkeypatch: pytest.MonkeyPatch,
    *,
    device_requests: bool = True,
    mount_root: Path | None = None,
    **spec: Any,
) -> dict:
    capture = CapturingApi(client.api)
    capture.install(monkeypatch)
    runtime = DockerRuntime("gpu01", client=client, gpu_device_requests=device_requests)
    roots = [str(mount_root)] if mount_root else []
    outcome = runtime.start(JobSpec.from_wire(job_spec(3, **spec), allowed_mount_roots=roots))
    assert outcome.created and outcome.status.running
    (created,) = capture.created
    return created


def test_the_device_request_names_exactly_the_assigned_gpu_uuids(
    offline_client: docker.DockerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    created = start(offline_client, monkeypatch, gpu_uuids=UUIDS, gpu_indices=[2, 3])

    assert created["HostConfig"]["DeviceRequests"] == [
        {
            "Driver": "nvidia",
            "Count": 0,
            "DeviceIDs": UUIDS,
            "Capabilities": [["gpu"]],
            "Options": {},
        }
    ]
    env = dict(item.split("=", 1) for item in created["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(UUIDS)
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(UUIDS)


def test_simulated_gpus_are_named_in_the_environment_but_requested_from_no_driver(
    offline_client: docker.DockerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    created = start(
        offline_client, monkeypatch, device_requests=False, gpu_uuids=UUIDS, gpu_indices=[2, 3]
    )

    assert "DeviceRequests" not in created["HostConfig"]
    env = dict(item.split("=", 1) for item in created["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(UUIDS)
    assert created["Labels"]["labportal.gpu_uuids"] == ",".join(UUIDS)


def test_a_job_without_gpus_gets_no_device_request_and_sees_none(
    offline_client: docker.DockerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    created = start(
        offline_client, monkeypatch, env={"NVIDIA_VISIBLE_DEVICES": "all", "HOME": "/home/a"}
    )

    assert "DeviceRequests" not in created["HostConfig"]
    env = dict(item.split("=", 1) for item in created["Env"])
    # A job cannot widen its GPU set through the toolkit's environment variable.
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["HOME"] == "/home/a"


def test_the_create_call_carries_the_whole_hardening(
    offline_client: docker.DockerClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "alice").mkdir()
    created = start(
        offline_client,
        monkeypatch,
        gpu_uuids=UUIDS[:1],
        cpus=1.5,
        memory_mb=2048,
        pids_limit=256,
        mount_root=tmp_path,
        mounts=[{"source": f"{tmp_path}/alice", "target": "/data", "read_only": False}],
    )
    host = created["HostConfig"]

    assert created["User"] == "1234:2345"
    assert created["name"] == "labportal-gpu01-job-3"
    assert created["Labels"] == {
        "labportal.job_id": "3",
        "labportal.node": "gpu01",
        "labportal.user": "alice",
        "labportal.managed": "true",
        "labportal.gpu_uuids": UUIDS[0],
        "labportal.attempt": "0",
    }
    # The SDK leaves "Privileged" out when false; the engine's default is false.
    assert host.get("Privileged", False) is False
    assert host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges:true"]
    assert (host["PidsLimit"], host["NanoCpus"]) == (256, 1_500_000_000)
    assert host["Memory"] == host["MemorySwap"] == 2048 * 1024 * 1024
    assert host["Init"] is True
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True and host["Tmpfs"] == {
        "/tmp": "rw,exec,nosuid,nodev,size=1024m"
    }
    assert host["Mounts"] == [
        {"Target": "/data", "Source": f"{tmp_path}/alice", "Type": "bind", "ReadOnly": False}
    ]
    assert "Binds" not in host and "CapAdd" not in host


def test_a_source_swapped_for_a_symlink_where_its_mounts_cannot_be_read_back_is_logged(
    offline_client: docker.DockerClient,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No process to read the mount table of (here: no Pid, as for a job that ended at once)."""
    scratch = tmp_path / "alice" / "scratch"
    scratch.mkdir(parents=True)
    capture = CapturingApi(offline_client.api)
    capture.install(monkeypatch)

    def start_while_swapping(*args: Any, **kwargs: Any) -> None:
        scratch.rmdir()
        scratch.symlink_to("/")

    monkeypatch.setattr(offline_client.api, "start", start_while_swapping)
    runtime = DockerRuntime("gpu01", client=offline_client)

    outcome = runtime.start(
        JobSpec.from_wire(
            job_spec(3, mounts=[{"source": str(scratch), "target": "/scratch"}]),
            allowed_mount_roots=[str(tmp_path)],
        )
    )

    assert outcome.created  # it ran: it cannot be undone, only told
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "could not be read back" in warning and f"{scratch} is a symlink (to /)" in warning


def test_docker_timestamps_parse_with_nanoseconds_and_unset_values() -> None:
    assert parse_docker_time("2025-01-02T03:04:05.123456789Z") == pytest.approx(1735787045.123456)
    assert parse_docker_time("0001-01-01T00:00:00Z") is None
    assert parse_docker_time(None) is None

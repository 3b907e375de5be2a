"""The gateway in front of the Docker runtime: a session container on the internal
network `labportal-sessions`, reached through the gateway and with no route out, and
a terminal exec'd into it as the job's user."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import aiohttp
import psutil
import pytest

from agent.gateway import GatewayServer
from agent.runtime import JobSpec
from agent.runtime.docker_exec import GUARD_RULE, SESSION_NETWORK
from agent.runtime.docker_runtime import DockerRuntime
from tests.agent.support import job_spec, wait_until
from tests.agent.test_gateway import headers, serving
from tests.asyncrun import run_coroutine

pytestmark = pytest.mark.docker

SERVE = (
    "mkdir -p /tmp/www/sessions/201 && echo hello > /tmp/www/sessions/201/index.html && "
    'exec httpd -f -p "$LABPORTAL_SESSION_PORT" -h /tmp/www'
)


@pytest.fixture
def docker_gateway(docker_runtime: DockerRuntime) -> Iterator[GatewayServer]:
    # The tickets name NODE: the gateway checks them for that name, whatever the runtime's.
    with serving(docker_runtime) as server:
        yield server


def test_a_session_container_is_reached_only_through_the_gateway_and_has_no_route_out(
    docker_runtime: DockerRuntime, docker_gateway: GatewayServer, docker_client: Any
) -> None:
    spec = JobSpec.from_wire(
        job_spec(201, command=["sh", "-c", SERVE], session={"kind": "jupyter", "port": 8888})
    )
    outcome = docker_runtime.start(spec)
    attrs = docker_client.api.inspect_container(outcome.container_id)
    network = docker_client.api.inspect_network(SESSION_NETWORK)

    assert set(attrs["NetworkSettings"]["Networks"]) == {SESSION_NETWORK}
    assert network["Internal"] is True
    assert network["Options"]["com.docker.network.bridge.enable_icc"] == "false"
    assert attrs["HostConfig"]["CapDrop"] == ["ALL"]
    assert attrs["HostConfig"]["PortBindings"] in ({}, None)
    env = dict(e.split("=", 1) for e in attrs["Config"]["Env"])
    assert (env["LABPORTAL_SESSION_HOST"], env["LABPORTAL_SESSION_PORT"]) == ("0.0.0.0", "8888")
    url = f"{docker_gateway.url}/jobs/201/proxy/sessions/201/index.html"

    async def get() -> tuple[int, str]:
        async with (
            aiohttp.ClientSession() as client,
            client.get(url, headers=headers(201, "http")) as response,
        ):
            return response.status, await response.text()

    wait_until(lambda: run_coroutine(get())[0] == 200, timeout_s=20, poll_s=0.2)
    assert run_coroutine(get()) == (200, "hello\n")

    async def shell() -> bytes:
        seen = b""
        async with (
            aiohttp.ClientSession() as client,
            client.ws_connect(
                f"{docker_gateway.url}/jobs/201/exec?cols=90&rows=20",
                headers=headers(201, "exec"),
            ) as ws,
        ):
            await ws.send_bytes(
                b"echo uid=$(id -u) routes=$(awk '$2 == \"00000000\"' /proc/net/route"
                b" | grep -c .) end\n"
            )
            while not re.search(rb"uid=\d+ routes=\d+ end", seen):
                message = await ws.receive(timeout=10)
                assert message.type == aiohttp.WSMsgType.BINARY, (message, seen)
                seen += message.data
        return seen

    # A service of this host that listens on every address, as a broker or sshd does.
    bridge_ip = network["IPAM"]["Config"][0]["Gateway"]
    accepted: list[object] = []
    listener = socket.create_server(("0.0.0.0", 0))
    listener.settimeout(20)
    host_port = listener.getsockname()[1]

    def accept() -> None:
        # Each connection is counted and closed at once, so that a probe never hangs.
        with contextlib.suppress(OSError):
            while True:
                conn, peer = listener.accept()
                accepted.append(peer)
                conn.close()

    waiter = threading.Thread(target=accept, daemon=True)
    waiter.start()
    # Every address of this host: the bridge's own, and the node's on its other networks.
    addresses = [bridge_ip] + [
        a.address
        for name, addrs in psutil.net_if_addrs().items()
        for a in addrs
        if a.family == socket.AF_INET and name != "lo" and a.address != bridge_ip
    ]
    probe = (
        " ".join(
            f"nc -w 2 {ip} {host_port} </dev/null >/dev/null 2>&1; echo reach=$?;"
            for ip in addresses
        )
        + " echo done\n"
    ).encode()

    out = run_coroutine(shell(), 30)
    reach = run_coroutine(_run_in(docker_gateway, probe, rb"\ndone"), 60)
    listener.close()
    waiter.join(timeout=10)
    # The host's own service was not reached: the agent's rule dropped the connection.
    assert accepted == [], "a session container reached a service of its node"
    codes = re.findall(rb"reach=(\d+)", reach)
    assert len(codes) == len(addresses) and b"0" not in codes, reach
    assert subprocess.run(["iptables", "-w", "-C", *GUARD_RULE]).returncode == 0
    found = re.search(rb"uid=(\d+) routes=(\d+) end", out)
    assert found is not None
    # As the job's user. (The internal network has a default route to its bridge, which
    # forwards nothing to other hosts: docs/agent.md, Gateway, says what the node's
    # firewall must add so that the node's own services are not reachable either.)
    assert found.group(1) == b"1234"


async def _run_in(gateway: GatewayServer, command: bytes, done: bytes) -> bytes:
    seen = b""
    async with (
        aiohttp.ClientSession() as client,
        client.ws_connect(
            f"{gateway.url}/jobs/201/exec?cols=200&rows=20", headers=headers(201, "exec")
        ) as ws,
    ):
        await ws.send_bytes(command)
        # The typed line echoes "$?", not a number: only the shell's answer matches.
        while not re.search(done, seen):
            message = await ws.receive(timeout=15)
            assert message.type == aiohttp.WSMsgType.BINARY, (message, seen)
            seen += message.data
    return seen

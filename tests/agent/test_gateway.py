"""The agent's gateway (agent/gateway.py) in front of local-process jobs: tickets, the
HTTP and WebSocket proxy, the exec terminal, status, and its errors.

The session jobs run tests/agent/gateway_upstream.py, a real server listening where
the contract says ($LABPORTAL_SESSION_HOST:$LABPORTAL_SESSION_PORT).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import sys
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from yarl import URL

from agent.gateway import Gateway, GatewayServer
from agent.runtime import ContainerRuntime, JobSpec, local
from agent.runtime.local import LocalProcessRuntime
from protocol import tickets
from protocol.signing import key_from_token, token_kid
from tests.agent.support import job_spec, wait_until
from tests.asyncrun import run_coroutine

NODE = "gpu01"
TOKEN = "lpn_gatewaytest0123456789abcdef"
UPSTREAM = str(Path(__file__).with_name("gateway_upstream.py"))
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return run_coroutine(coro, 30)


def ticket(job_id: int, purpose: tickets.Purpose, *, token: str = TOKEN, **kw: Any) -> str:
    return tickets.issue(
        {token_kid(token): key_from_token(token)},
        node=kw.pop("node", NODE),
        job_id=job_id,
        attempt=kw.pop("attempt", 0),
        purpose=purpose,
        user="alice",
        **kw,
    )


def headers(job_id: int, purpose: tickets.Purpose, **kw: Any) -> dict[str, str]:
    return {tickets.HEADER: ticket(job_id, purpose, **kw)}


class _NotRoot:
    """``os`` as a non-root agent sees it (the demo's case)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    @staticmethod
    def geteuid() -> int:
        return 1000


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalProcessRuntime]:
    # As root the runtime would drop the jobs to the spec's uid, which cannot reach this
    # interpreter under /root: run them as the demo's non-root agent does, as itself.
    monkeypatch.setattr(local, "os", _NotRoot())
    runtime = LocalProcessRuntime(tmp_path, enabled=True)
    yield runtime
    runtime.close()


@contextlib.contextmanager
def serving(runtime: ContainerRuntime) -> Iterator[GatewayServer]:
    """The gateway for ``runtime`` on a free loopback port, checking tickets for NODE."""
    server = GatewayServer(Gateway(node=NODE, token=TOKEN, runtime=runtime), "127.0.0.1", 0)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def gateway(runtime: LocalProcessRuntime) -> Iterator[GatewayServer]:
    with serving(runtime) as server:
        yield server


def start(runtime: LocalProcessRuntime, job_id: int, command: list[str], **kw: Any) -> None:
    runtime.start(JobSpec.from_wire(job_spec(job_id, command=command, **kw)))


def status_of(gateway: GatewayServer, job_id: int) -> dict[str, Any]:
    async def get() -> dict[str, Any]:
        async with (
            aiohttp.ClientSession() as client,
            client.get(
                f"{gateway.url}/jobs/{job_id}/status", headers=headers(job_id, "probe")
            ) as response,
        ):
            assert response.status == 200, await response.text()
            return dict(await response.json())

    return run(get())


@pytest.fixture
def session(runtime: LocalProcessRuntime, gateway: GatewayServer) -> int:
    """Job 11: a session running the test upstream, ready."""
    start(runtime, 11, [sys.executable, UPSTREAM], session={"kind": "jupyter"})
    wait_until(lambda: status_of(gateway, 11)["ready"], timeout_s=20)
    return 11


def proxy_url(gateway: GatewayServer, job_id: int, rest: str) -> str:
    return f"{gateway.url}/jobs/{job_id}/proxy/sessions/{job_id}/{rest}"


# -- tickets ------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["proxy/sessions/11/echo/x", "exec", "status"])
@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda route: {}, "missing"),
        (lambda route: {tickets.HEADER: "v1.abc"}, "malformed"),
        (
            lambda route: headers(11, _purpose(route), token="lpn_someoneelse0000000000"),
            "bad_signature",
        ),
        (
            lambda route: {tickets.HEADER: ticket(11, _purpose(route))[:-4] + "0000"},
            "bad_signature",
        ),
        (lambda route: headers(12, _purpose(route)), "wrong_job"),
        (lambda route: headers(11, _purpose(route), node="gpu02"), "wrong_node"),
        (
            lambda route: headers(11, "exec" if _purpose(route) != "exec" else "http"),
            "wrong_purpose",
        ),
        (lambda route: headers(11, _purpose(route), now=1.0e9), "expired"),
    ],
    ids=["missing", "malformed", "other-token", "forged", "job", "node", "purpose", "expired"],
)
def test_every_route_refuses_a_request_without_a_valid_ticket_for_it(
    gateway: GatewayServer, route: str, make: Any, reason: str
) -> None:
    async def get() -> tuple[int, dict[str, Any]]:
        async with (
            aiohttp.ClientSession() as client,
            client.get(f"{gateway.url}/jobs/11/{route}", headers=make(route)) as response,
        ):
            return response.status, await response.json()

    status, body = run(get())

    assert status == 403
    assert body["error"] == reason and body["detail"]


def _purpose(route: str) -> tickets.Purpose:
    return "http" if route.startswith("proxy") else "exec" if route == "exec" else "probe"


def test_a_ticket_for_an_earlier_attempt_opens_nothing_of_the_requeued_job(
    runtime: LocalProcessRuntime, gateway: GatewayServer
) -> None:
    # Job 31 runs its second attempt (requeued): the portal's tickets now say attempt 2.
    start(runtime, 31, [sys.executable, UPSTREAM], session={"kind": "jupyter"}, attempt=2)

    async def get(route: str, purpose: tickets.Purpose, attempt: int) -> tuple[int, str]:
        async with (
            aiohttp.ClientSession() as client,
            client.get(
                f"{gateway.url}/jobs/31/{route}",
                headers=headers(31, purpose, attempt=attempt),
            ) as response,
        ):
            return response.status, await response.text()

    wait_until(lambda: '"ready": true' in run(get("status", "probe", 2))[1], timeout_s=20)
    routes: list[tuple[str, tickets.Purpose]] = [
        ("status", "probe"),
        ("proxy/sessions/31/echo/x", "http"),
        ("exec", "exec"),
    ]
    for route, purpose in routes:
        status, body = run(get(route, purpose, 1))
        assert status == 403, (route, body)
        assert json.loads(body)["error"] == "wrong_attempt"
        assert "attempt 2" in json.loads(body)["detail"]
    assert run(get("proxy/sessions/31/echo/x", "http", 2))[0] == 200


def test_a_path_outside_the_routes_is_404_and_names_nothing(gateway: GatewayServer) -> None:
    async def get() -> int:
        async with aiohttp.ClientSession() as client, client.get(f"{gateway.url}/") as r:
            return r.status

    assert run(get()) == 404


def test_a_job_that_is_not_running_here_is_404_on_every_route(
    runtime: LocalProcessRuntime, gateway: GatewayServer
) -> None:
    start(runtime, 21, ["true"])
    wait_until(lambda: not runtime.job_status(21).running)  # type: ignore[union-attr]

    async def get(job_id: int, route: str, purpose: tickets.Purpose) -> tuple[int, str]:
        async with (
            aiohttp.ClientSession() as client,
            client.get(
                f"{gateway.url}/jobs/{job_id}/{route}", headers=headers(job_id, purpose)
            ) as response,
        ):
            return response.status, (await response.json())["error"]

    for job_id in (21, 999):
        assert run(get(job_id, "status", "probe")) == (404, "unknown_job")
        assert run(get(job_id, "proxy/x", "http")) == (404, "unknown_job")
        assert run(get(job_id, "exec", "exec")) == (404, "unknown_job")


# -- readiness ----------------------------------------------------------------------


def test_a_session_whose_server_does_not_listen_yet_is_503_and_not_ready(
    runtime: LocalProcessRuntime, gateway: GatewayServer
) -> None:
    start(runtime, 31, ["sleep", "60"], session={"kind": "jupyter"})

    async def get() -> tuple[int, str | None, str]:
        async with (
            aiohttp.ClientSession() as client,
            client.get(proxy_url(gateway, 31, "lab"), headers=headers(31, "http")) as response,
        ):
            return response.status, response.headers.get("Retry-After"), await response.text()

    status, retry_after, body = run(get())

    assert (status, retry_after) == (503, "1")
    assert json.loads(body)["error"] == "not_ready"
    assert status_of(gateway, 31) == {"ready": False, "last_activity": None, "connections": 0}


def test_a_batch_job_has_no_server_to_proxy_but_is_ready_for_a_terminal(
    runtime: LocalProcessRuntime, gateway: GatewayServer
) -> None:
    start(runtime, 32, ["sleep", "60"])

    async def get() -> tuple[int, str]:
        async with (
            aiohttp.ClientSession() as client,
            client.get(proxy_url(gateway, 32, "x"), headers=headers(32, "http")) as response,
        ):
            return response.status, (await response.json())["error"]

    assert run(get()) == (404, "no_server")
    assert status_of(gateway, 32)["ready"] is True


def test_the_session_gets_its_host_and_port_in_its_environment(
    runtime: LocalProcessRuntime, gateway: GatewayServer
) -> None:
    start(runtime, 33, ["sh", "-c", "env; sleep 60"], session={"kind": "terminal"})
    env = wait_until(
        lambda: "LABPORTAL_SESSION_PORT=" in (runtime.logs(33, 100) or "") and runtime.logs(33, 100)
    )

    assert "LABPORTAL_SESSION_HOST=127.0.0.1" in env
    port = int(env.split("LABPORTAL_SESSION_PORT=")[1].split()[0])
    assert 1024 <= port <= 65535
    # A terminal session runs no server: nothing to proxy, and ready while it runs.
    assert runtime.session_upstream(33) is None
    assert status_of(gateway, 33)["ready"] is True


# -- the HTTP proxy -----------------------------------------------------------------


def test_a_request_reaches_the_server_with_its_path_query_and_headers_but_not_the_ticket(
    gateway: GatewayServer, session: int
) -> None:
    async def get() -> tuple[int, dict[str, Any]]:
        async with (
            aiohttp.ClientSession() as client,
            client.put(
                URL(proxy_url(gateway, session, "echo/a%2Fb%20c?x=1&y=%2F&x=2"), encoded=True),
                headers={
                    **headers(session, "http"),
                    "Authorization": "token s3cret",
                    "X-Custom": "kept",
                    "Connection": "keep-alive, X-Hop",
                    "X-Hop": "dropped",
                    "Keep-Alive": "timeout=5",
                    "X-Forwarded-Proto": "https",
                },
                data=b"the body",
            ) as response,
        ):
            return response.status, await response.json()

    status, echoed = run(get())

    assert status == 200
    assert echoed["method"] == "PUT"
    assert echoed["raw_path"] == f"/sessions/{session}/echo/a%2Fb%20c?x=1&y=%2F&x=2"
    assert echoed["body"] == "the body"
    sent = {k.lower(): v for k, v in echoed["headers"]}
    assert sent["authorization"] == "token s3cret"
    assert sent["x-custom"] == "kept"
    assert tickets.HEADER.lower() not in sent
    assert "x-hop" not in sent and "keep-alive" not in sent
    assert sent["x-forwarded-for"] == "127.0.0.1"
    assert sent["x-forwarded-proto"] == "https"  # as the portal said, not overwritten
    assert sent["x-forwarded-host"] == sent["host"] == gateway.url.removeprefix("http://")


@pytest.mark.parametrize("code", [201, 302, 404, 500])
def test_the_server_s_status_and_headers_come_back_as_they_are(
    gateway: GatewayServer, session: int, code: int
) -> None:
    async def get() -> tuple[int, str | None, str]:
        async with (
            aiohttp.ClientSession() as client,
            client.get(
                proxy_url(gateway, session, f"status/{code}"),
                headers=headers(session, "http"),
                allow_redirects=False,
            ) as response,
        ):
            return response.status, response.headers.get("X-Upstream"), await response.text()

    assert run(get()) == (code, "yes", f"status {code}")


def test_a_large_upload_is_streamed_to_the_server_whole(
    gateway: GatewayServer, session: int
) -> None:
    chunk = os.urandom(256 * 1024)
    count = 40  # 10 MiB

    async def body() -> AsyncIterator[bytes]:
        for _ in range(count):
            yield chunk

    async def post() -> dict[str, Any]:
        async with (
            aiohttp.ClientSession() as client,
            client.post(
                proxy_url(gateway, session, "upload"),
                headers=headers(session, "http"),
                data=body(),
            ) as response,
        ):
            assert response.status == 200
            return dict(await response.json())

    assert run(post()) == {
        "sha256": hashlib.sha256(chunk * count).hexdigest(),
        "size": len(chunk) * count,
    }


def test_a_response_is_streamed_to_the_client_as_the_server_writes_it(
    gateway: GatewayServer, session: int
) -> None:
    async def go() -> list[bytes]:
        async with (
            aiohttp.ClientSession() as client,
            client.get(
                proxy_url(gateway, session, "stream"), headers=headers(session, "http")
            ) as response,
        ):
            # The server holds "last" back until released: a gateway that buffered
            # the whole response would never hand over "first".
            first = await asyncio.wait_for(response.content.readline(), 5)
            async with client.get(
                proxy_url(gateway, session, "release"), headers=headers(session, "http")
            ) as released:
                assert released.status == 200
            last = await asyncio.wait_for(response.content.readline(), 5)
            return [first, last]

    assert run(go()) == [b"first\n", b"last\n"]


# -- the WebSocket proxy ------------------------------------------------------------


def test_a_websocket_is_proxied_both_ways_with_its_subprotocol_and_close_code(
    gateway: GatewayServer, session: int
) -> None:
    async def go() -> dict[str, Any]:
        async with (
            aiohttp.ClientSession() as client,
            client.ws_connect(
                proxy_url(gateway, session, "ws"),
                headers=headers(session, "http"),
                protocols=["echo.v1"],
            ) as ws,
        ):
            result: dict[str, Any] = {"protocol": ws.protocol}
            await ws.send_str("hello")
            result["text"] = (await ws.receive(timeout=5)).data
            await ws.send_bytes(b"\x00\x01binary")
            result["binary"] = (await ws.receive(timeout=5)).data
            result["during"] = await asyncio.to_thread(status_of, gateway, session)
            await ws.send_str("close")
            closing = await ws.receive(timeout=5)
            result["close"] = (closing.type, ws.close_code)
            return result

    result = run(go())

    assert result["protocol"] == "echo.v1"
    assert (result["text"], result["binary"]) == ("hello", b"\x00\x01binary")
    assert result["during"]["connections"] == 1
    assert result["during"]["last_activity"] is not None
    assert result["close"] == (aiohttp.WSMsgType.CLOSE, 4001)
    wait_until(lambda: status_of(gateway, session)["connections"] == 0)


def test_activity_is_the_last_proxied_request_or_frame(
    gateway: GatewayServer, session: int
) -> None:
    before = status_of(gateway, session)["last_activity"]

    async def get() -> None:
        async with (
            aiohttp.ClientSession() as client,
            client.get(
                proxy_url(gateway, session, "echo/x"), headers=headers(session, "http")
            ) as r,
        ):
            assert r.status == 200

    run(get())
    after = status_of(gateway, session)["last_activity"]

    assert after is not None and (before is None or after > before)
    assert status_of(gateway, session)["last_activity"] == after  # a probe is no activity


# -- the exec terminal --------------------------------------------------------------


async def _read_until(ws: aiohttp.ClientWebSocketResponse, marker: bytes, times: int = 1) -> bytes:
    seen = b""
    while seen.count(marker) < times:
        try:
            message = await ws.receive(timeout=5)
        except TimeoutError:
            raise AssertionError(f"no {marker!r} in {seen!r}") from None
        assert message.type == aiohttp.WSMsgType.BINARY, message
        seen += message.data
    return seen


def test_a_terminal_runs_a_shell_in_the_job_with_its_env_and_cwd_and_resizes(
    runtime: LocalProcessRuntime, gateway: GatewayServer, tmp_path: Path
) -> None:
    start(runtime, 41, ["sleep", "60"], env={"GREETING": "from-the-job"})

    async def go() -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        async with (
            aiohttp.ClientSession() as client,
            client.ws_connect(
                f"{gateway.url}/jobs/41/exec?cols=80&rows=24", headers=headers(41, "exec")
            ) as ws,
        ):
            await ws.send_bytes(b"echo hi\n")
            # Once in the command line the terminal echoes, once as its output.
            out["hi"] = await _read_until(ws, b"hi\r\n", times=2)
            await ws.send_bytes(b'echo "$GREETING $LABPORTAL_JOB_ID"; pwd; stty size\n')
            out["env"] = await _read_until(ws, b"24 80")
            await ws.send_str(json.dumps({"resize": [100, 30]}))
            await ws.send_bytes(b"stty size\n")
            out["resized"] = await _read_until(ws, b"30 100")
            await ws.send_str("not a resize")
            # The shell's prompt may still be on its way: the refusal is the next text frame.
            reply = await ws.receive(timeout=5)
            while reply.type == aiohttp.WSMsgType.BINARY:
                reply = await ws.receive(timeout=5)
            out["refused"] = reply.data.encode()
            await ws.send_bytes(b"echo pid=$((1000000+$$))\n")
            out["pid"] = await _read_until(ws, b"pid=1")
        return out

    out = run(go())

    assert b"from-the-job 41" in out["env"]
    assert str(tmp_path / "local-jobs" / "41").encode() in out["env"]
    assert b"resize" in out["refused"]
    pid = int(re.search(rb"pid=1(\d{6})", out["pid"]).group(1))  # type: ignore[union-attr]
    # The socket closed: the shell is gone, the job is not.
    wait_until(lambda: not _alive(pid))
    assert runtime.job_status(41).running  # type: ignore[union-attr]
    assert status_of(gateway, 41)["connections"] == 0
    assert status_of(gateway, 41)["last_activity"] is not None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_the_terminal_closes_when_its_shell_exits(
    runtime: LocalProcessRuntime, gateway: GatewayServer
) -> None:
    start(runtime, 42, ["sleep", "60"])

    async def go() -> aiohttp.WSMsgType:
        async with (
            aiohttp.ClientSession() as client,
            client.ws_connect(f"{gateway.url}/jobs/42/exec", headers=headers(42, "exec")) as ws,
        ):
            await ws.send_bytes(b"exit\n")
            while True:
                message = await ws.receive(timeout=10)
                if message.type != aiohttp.WSMsgType.BINARY:
                    return message.type

    assert run(go()) in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)


@pytest.mark.parametrize("query", ["cols=0", "rows=abc", "cols=5000"])
def test_a_terminal_size_out_of_range_is_400_saying_the_range(
    runtime: LocalProcessRuntime, gateway: GatewayServer, query: str
) -> None:
    start(runtime, 43, ["sleep", "60"])

    async def get() -> tuple[int, str]:
        async with (
            aiohttp.ClientSession() as client,
            client.get(f"{gateway.url}/jobs/43/exec?{query}", headers=headers(43, "exec")) as r,
        ):
            return r.status, (await r.json())["detail"]

    status, detail = run(get())
    assert status == 400 and "from 1 to 1000" in detail


def test_exec_without_a_websocket_upgrade_is_400(
    runtime: LocalProcessRuntime, gateway: GatewayServer
) -> None:
    start(runtime, 44, ["sleep", "60"])

    async def get() -> tuple[int, str]:
        async with (
            aiohttp.ClientSession() as client,
            client.get(f"{gateway.url}/jobs/44/exec", headers=headers(44, "exec")) as r,
        ):
            return r.status, (await r.json())["error"]

    assert run(get()) == (400, "not_websocket")

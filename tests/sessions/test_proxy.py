"""The ASGI proxy against a fake gateway: auth, headers, streamed bodies, WebSocket relay."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from aiohttp import WSMsgType, web
from django.test import Client

from jobqueue.models import Job
from labportal.asgi import application
from protocol import tickets
from sessions import proxy
from sessions.launch import session_token
from tests.sessions.conftest import running_session

pytestmark = pytest.mark.django_db(transaction=True)
HOST = "portal.test"
SEEN = web.AppKey("seen", list)


def fake_gateway() -> web.Application:
    """What the agent's gateway does, minus the ticket check: echo what it was sent."""
    seen: list[dict[str, Any]] = []

    async def proxied(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            ws = web.WebSocketResponse(protocols=["v1.kernel.websocket.jupyter.org"])
            await ws.prepare(request)
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    await ws.send_str(f"echo:{msg.data}")
                elif msg.type == WSMsgType.BINARY:
                    await ws.send_bytes(b"echo:" + msg.data)
            return ws
        body = await request.read()
        seen.append(
            {
                "path": request.match_info["rest"],
                "headers": dict(request.headers),
                "body": body,
                "query": request.query_string,
            }
        )
        response = web.StreamResponse(
            status=200, headers={"Content-Type": "text/plain", "Set-Cookie": "_xsrf=1; Path=/"}
        )
        await response.prepare(request)
        for i in range(3):  # streamed: three chunks
            await response.write(f"chunk{i};".encode())
        await response.write(body)
        await response.write_eof()
        return response

    async def exec_shell(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_bytes(f"cols={request.query.get('cols')}$ ".encode())
        async for msg in ws:
            if msg.type == WSMsgType.BINARY:
                await ws.send_bytes(b"ran:" + msg.data)
        return ws

    app = web.Application()
    app[SEEN] = seen
    app.router.add_route("*", "/jobs/{job}/proxy/{rest:.*}", proxied)
    app.router.add_get("/jobs/{job}/exec", exec_shell)
    return app


def run(coroutine: Any) -> Any:
    """In a thread of its own: Playwright's sync API may hold an event loop in this one."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def cookie_for(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}; csrftoken=abc; other=kept"


async def with_gateway(job: Job, body: Callable[[web.Application], Awaitable[Any]]) -> Any:
    app = fake_gateway()
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    from cluster.models import Node

    await asyncio.to_thread(
        lambda: Node.objects.filter(name="gpu01").update(gateway_url=f"http://127.0.0.1:{port}")
    )
    try:
        return await body(app)
    finally:
        await proxy.client.close()
        await runner.cleanup()


async def http(
    path: str,
    *,
    cookie: str = "",
    method: str = "GET",
    body: bytes = b"",
    origin: str | None = None,
) -> tuple[int, dict[str, str], bytes]:
    headers = [(b"host", HOST.encode())]
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    if origin:
        headers.append((b"origin", origin.encode()))
    if body:
        headers.append((b"content-length", str(len(body)).encode()))
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"a=1",
        "headers": headers,
        "scheme": "http",
    }
    parts = [body[: len(body) // 2], body[len(body) // 2 :]] if body else [b""]
    incoming = [
        {"type": "http.request", "body": p, "more_body": i < len(parts) - 1}
        for i, p in enumerate(parts)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await application(scope, receive, send)
    start = sent[0]
    answer = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], answer, b"".join(m.get("body", b"") for m in sent[1:])


async def websocket(
    path: str,
    *,
    cookie: str,
    frames: list[dict[str, Any]],
    origin: str = f"http://{HOST}",
    protocol: str = "",
) -> list[dict[str, Any]]:
    headers = [(b"host", HOST.encode()), (b"cookie", cookie.encode()), (b"origin", origin.encode())]
    if protocol:
        headers.append((b"sec-websocket-protocol", protocol.encode()))
    scope = {
        "type": "websocket",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"cols=80&rows=24",
        "headers": headers,
        "scheme": "ws",
        "subprotocols": [protocol] if protocol else [],
    }
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await inbox.put({"type": "websocket.connect"})
    sent: list[dict[str, Any]] = []
    wanted = len(frames)

    async def receive() -> dict[str, Any]:
        return await inbox.get()

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "websocket.accept":
            for frame in frames:
                await inbox.put({"type": "websocket.receive", **frame})
        replies = [m for m in sent if m["type"] == "websocket.send"]
        if len(replies) >= wanted + (1 if "terminal" in path else 0):
            await inbox.put({"type": "websocket.disconnect", "code": 1000})

    await asyncio.wait_for(application(scope, receive, send), timeout=10)
    return sent


def test_the_owner_gets_the_servers_answer_streamed_with_the_token_added(
    cluster: Any, alice: Any, image: Any
) -> None:
    job = running_session(alice, image)
    cookie = cookie_for(alice)

    async def check(app: web.Application) -> None:
        status, headers, body = await http(f"/sessions/{job.pk}/lab/tree", cookie=cookie)
        assert status == 200
        assert body == b"chunk0;chunk1;chunk2;"
        # The server's cookies stay under the session's path.
        assert headers["set-cookie"] == f"_xsrf=1; Path=/sessions/{job.pk}/"
        seen = app[SEEN][0]
        assert seen["path"] == f"sessions/{job.pk}/lab/tree" and seen["query"] == "a=1"
        assert (
            seen["headers"]["Authorization"] == f"token {session_token(job_id=job.pk, attempt=1)}"
        )
        assert tickets.HEADER in seen["headers"]
        # The portal's own cookies never reach the member's server; others do.
        assert seen["headers"]["Cookie"] == "other=kept"

    run(with_gateway(job, check))


def test_a_post_body_is_streamed_upstream_when_it_comes_from_the_portal(
    cluster: Any, alice: Any, image: Any
) -> None:
    job = running_session(alice, image)
    cookie = cookie_for(alice)

    async def check(app: web.Application) -> None:
        status, _h, body = await http(
            f"/sessions/{job.pk}/api/contents",
            cookie=cookie,
            method="POST",
            body=b"x" * 200_000,
            origin=f"http://{HOST}",
        )
        assert status == 200 and body.endswith(b"x" * 200_000)
        assert app[SEEN][0]["body"] == b"x" * 200_000
        # The same request from another site is refused before it goes anywhere.
        status, _h, _b = await http(
            f"/sessions/{job.pk}/api/contents",
            cookie=cookie,
            method="POST",
            body=b"y",
            origin="http://evil.test",
        )
        assert status == 403 and len(app[SEEN]) == 1

    run(with_gateway(job, check))


def test_a_pages_burst_is_authorised_once_and_a_sign_out_holds_for_the_ttl_at_most(
    cluster: Any, alice: Any, image: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.contrib.sessions.models import Session

    job = running_session(alice, image)
    cookie = cookie_for(alice)
    clock = {"now": 1000.0}
    monkeypatch.setattr(proxy.time, "monotonic", lambda: clock["now"])
    lookups: list[int] = []
    reachable = proxy.job_reachable_by

    def counted(user: Any, job_id: int) -> Any:
        lookups.append(job_id)
        return reachable(user, job_id)

    monkeypatch.setattr(proxy, "job_reachable_by", counted)

    async def check(app: web.Application) -> None:
        assert (await http(f"/sessions/{job.pk}/lab", cookie=cookie))[0] == 200
        for path in ("api/kernels", "api/sessions", "static/x.js"):
            assert (await http(f"/sessions/{job.pk}/{path}", cookie=cookie))[0] == 200
        # JupyterLab's burst: each request reached the server at its own path, and only
        # the first looked up who the member is and where the job runs.
        assert [seen["path"] for seen in app[SEEN]][1:] == [
            f"sessions/{job.pk}/api/kernels",
            f"sessions/{job.pk}/api/sessions",
            f"sessions/{job.pk}/static/x.js",
        ]
        assert lookups == [job.pk]
        # Signed out: the path holds AUTH_TTL_S at most, then it asks again and refuses.
        await asyncio.to_thread(Session.objects.all().delete)
        clock["now"] += proxy.AUTH_TTL_S + 0.1
        status, headers, _b = await http(f"/sessions/{job.pk}/lab", cookie=cookie)
        assert status == 302 and "/login/" in headers["location"]

    run(with_gateway(job, check))


def test_another_member_gets_403_and_anonymous_is_sent_to_sign_in(
    cluster: Any, alice: Any, bob: Any, image: Any
) -> None:
    job = running_session(alice, image)
    bob_cookie = cookie_for(bob)

    async def check(app: web.Application) -> None:
        status, _h, _b = await http(f"/sessions/{job.pk}/lab", cookie=bob_cookie)
        assert status == 403
        status, headers, _b = await http(f"/sessions/{job.pk}/lab")
        assert status == 302 and headers["location"].endswith(f"?next=/sessions/{job.pk}/lab")
        assert app[SEEN] == []

    run(with_gateway(job, check))


def test_staff_reach_a_members_session(
    cluster: Any, alice: Any, admin_user: Any, image: Any
) -> None:
    job = running_session(alice, image)
    cookie = cookie_for(admin_user)

    async def check(app: web.Application) -> None:
        status, _h, _b = await http(f"/sessions/{job.pk}/lab", cookie=cookie)
        assert status == 200

    run(with_gateway(job, check))


def test_websocket_messages_are_relayed_with_the_subprotocol(
    cluster: Any, alice: Any, image: Any
) -> None:
    job = running_session(alice, image)
    cookie = cookie_for(alice)

    async def check(app: web.Application) -> None:
        sent = await websocket(
            f"/sessions/{job.pk}/api/kernels/k1/channels",
            cookie=cookie,
            frames=[{"text": "hello"}, {"bytes": b"\x00\x01"}],
            protocol="v1.kernel.websocket.jupyter.org",
        )
        assert sent[0] == {
            "type": "websocket.accept",
            "subprotocol": "v1.kernel.websocket.jupyter.org",
        }
        replies = [m for m in sent if m["type"] == "websocket.send"]
        assert replies[0]["text"] == "echo:hello"
        assert replies[1]["bytes"] == b"echo:\x00\x01"

    run(with_gateway(job, check))


def test_a_websocket_from_another_site_or_member_is_closed_with_4403(
    cluster: Any, alice: Any, bob: Any, image: Any
) -> None:
    job = running_session(alice, image)
    alice_cookie, bob_cookie = cookie_for(alice), cookie_for(bob)

    async def check(app: web.Application) -> None:
        sent = await websocket(
            f"/sessions/{job.pk}/api/events/subscribe",
            cookie=alice_cookie,
            frames=[],
            origin="http://evil.test",
        )
        assert sent[-1]["type"] == "websocket.close" and sent[-1]["code"] == 4403
        sent = await websocket(
            f"/sessions/{job.pk}/api/events/subscribe", cookie=bob_cookie, frames=[]
        )
        assert sent[-1]["code"] == 4403
        sent = await websocket(f"/sessions/{job.pk}/api/events/subscribe", cookie="", frames=[])
        assert sent[-1]["code"] == 4401

    run(with_gateway(job, check))


def test_the_terminal_relays_to_the_gateways_exec(cluster: Any, alice: Any, image: Any) -> None:
    # Any running job of the member's, a batch job too.
    from django.utils import timezone

    from jobqueue.submit import job_submit

    session = running_session(alice, image)
    job = job_submit(owner=alice, queue="normal", image=image.reference, command="sleep 100")
    Job.objects.filter(pk=job.pk).update(
        state=Job.State.RUNNING, node=session.node, started_at=timezone.now()
    )
    job.refresh_from_db()
    cookie = cookie_for(alice)

    async def check(app: web.Application) -> None:
        sent = await websocket(
            f"/jobs/{job.pk}/terminal/ws", cookie=cookie, frames=[{"bytes": b"ls\r"}]
        )
        replies = [m["bytes"] for m in sent if m["type"] == "websocket.send"]
        assert replies[0] == b"cols=80$ " and replies[1] == b"ran:ls\r"

    run(with_gateway(job, check))


def test_other_paths_go_to_django(cluster: Any) -> None:
    assert proxy.handles("/sessions/12/lab") and proxy.handles("/jobs/12/terminal/ws")
    assert not proxy.handles("/sessions/") and not proxy.handles("/sessions/new/")
    assert not proxy.handles("/jobs/12/terminal/")

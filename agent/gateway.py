"""The node's gateway: the portal's one path to a job's interactive server and shell.

An aiohttp server in a thread of its own (``GatewayServer``), started by the agent
when ``--gateway-listen`` is given. Every request carries a ticket
(``protocol.tickets``, header ``X-LabPortal-Ticket``) that the portal signed under
this node's token for one job and one purpose, or it is refused with 403 and a JSON
reason before anything else is looked at. The routes:

- ``ANY /jobs/<id>/proxy/<rest>`` (purpose ``http``): HTTP (bodies streamed both
  ways) and WebSocket, to the session's server at ``<upstream>/<rest>?<query>``;
- ``GET /jobs/<id>/exec?cols=&rows=`` (purpose ``exec``): a WebSocket to a shell on
  a terminal in any running job; binary frames are the terminal's bytes, a text
  frame ``{"resize": [cols, rows]}`` resizes it;
- ``GET /jobs/<id>/status`` (purpose ``probe``): ``{"ready", "last_activity",
  "connections"}``.

An unknown or ended job is 404; a server that does not accept connections yet is 503
with ``Retry-After``. The runtime (``session_upstream``, ``exec_shell``) says where a
job's server is and opens its shell; the gateway keeps only per-job activity.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import AsyncIterable, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import WSMsgType, web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from agent.runtime.base import ContainerRuntime, ExecRefused, ExecSession
from protocol import tickets
from protocol.signing import key_from_token, token_kid

log = logging.getLogger(__name__)

# RFC 9110 7.6.1, and what a proxy must not pass on; the ticket never leaves the gateway.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        tickets.HEADER.lower(),
        tickets.PROBE_HEADER.lower(),
    }
)
# A WebSocket handshake's own headers: each leg makes its own.
_WS_HANDSHAKE = frozenset(
    {
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-protocol",
        "sec-websocket-accept",
        "content-length",
    }
)
RETRY_AFTER_S = 1
MAX_WS_MESSAGE = 64 * 1024 * 1024
MAX_TERMINAL_SIZE = 1000
_READ_CHUNK = 64 * 1024
_TERMINAL_BACKLOG = 64  # chunks of a shell's output waiting for the browser
# How long a looked-up upstream is trusted before the runtime is asked again.
_UPSTREAM_TTL_S = 2.0
_PROBE_TIMEOUT_S = 1.0


def _error(status: int, reason: str, detail: str, **headers: str) -> web.Response:
    return web.json_response({"error": reason, "detail": detail}, status=status, headers=headers)


@dataclass
class JobActivity:
    last: float | None = None
    connections: int = 0


class Gateway:
    """The gateway's handlers, for one node's runtime, checking tickets under its token."""

    def __init__(
        self,
        *,
        node: str,
        token: str,
        runtime: ContainerRuntime,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.runtime = runtime
        self._key = key_from_token(token)
        self._kid = token_kid(token)
        self._clock = clock
        self._activity: dict[int, JobActivity] = {}
        self._upstreams: dict[int, tuple[float, tuple[str | None, int | None] | None]] = {}
        self._client: aiohttp.ClientSession | None = None

    # -- the app ---------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=0)
        app.router.add_route("*", r"/jobs/{job_id}/proxy/{rest:.*}", self.proxy)
        app.router.add_get(r"/jobs/{job_id}/exec", self.exec)
        app.router.add_get(r"/jobs/{job_id}/status", self.status)
        app.on_startup.append(self._open_client)
        app.on_cleanup.append(self._close_client)
        return app

    async def _open_client(self, _app: web.Application) -> None:
        self._client = aiohttp.ClientSession(
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
        )

    async def _close_client(self, _app: web.Application) -> None:
        if self._client is not None:
            await self._client.close()

    @property
    def client(self) -> aiohttp.ClientSession:
        assert self._client is not None, "the gateway's app has not started"
        return self._client

    # -- what every route does first -------------------------------------------

    def _admit(
        self, request: web.Request, purpose: tickets.Purpose
    ) -> tuple[int, int] | web.Response:
        """The job id and attempt, if the ticket is this node's for that job and purpose;
        else a 403."""
        raw = request.match_info["job_id"]
        job_id = int(raw) if raw.isdigit() and len(raw) <= 19 else 0
        try:
            payload = tickets.verify(
                self._key,
                self._kid,
                request.headers.get(tickets.HEADER),
                node=self.node,
                job_id=job_id,
                purpose=purpose,
                now=self._clock(),
            )
        except tickets.TicketRefused as exc:
            return _error(403, exc.reason, exc.detail)
        attempt = payload.get("attempt")
        if not isinstance(attempt, int) or isinstance(attempt, bool):
            return _error(403, "malformed", "'attempt' must be a whole number")
        return job_id, attempt

    async def _blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    def _lookup(self, job_id: int) -> tuple[str | None, int | None] | None:
        """The running job's server (or None) and attempt; None if it does not run here."""
        status = self.runtime.job_status(job_id)
        if status is None or not status.running:
            return None
        return self.runtime.session_upstream(job_id), status.attempt

    async def _current(
        self, job_id: int, *, fresh: bool = False
    ) -> tuple[str | None, int | None] | None:
        now = time.monotonic()
        cached = self._upstreams.get(job_id)
        if cached is not None and not fresh and now - cached[0] < _UPSTREAM_TTL_S:
            return cached[1]
        found = await self._blocking(self._lookup, job_id)
        self._upstreams[job_id] = (now, found)
        return found

    async def _gone_or_stale(
        self, job_id: int, attempt: int, *, fresh: bool = False
    ) -> web.Response | None:
        """A 404 if the job does not run here, a 403 if it runs another attempt than the
        ticket's (a requeued job: a ticket for its earlier run opens nothing of this one)."""
        found = await self._current(job_id, fresh=fresh)
        if found is None:
            return _unknown(job_id)
        running = found[1]
        if running is not None and running != attempt:
            return _error(
                403,
                "wrong_attempt",
                f"the ticket is for attempt {attempt} of job {job_id}, which now runs attempt {running}",
            )
        return None

    def _touch(self, job_id: int) -> None:
        self._activity.setdefault(job_id, JobActivity()).last = self._clock()

    @contextlib.contextmanager
    def _connection(self, job_id: int) -> Any:
        activity = self._activity.setdefault(job_id, JobActivity())
        activity.connections += 1
        try:
            yield
        finally:
            activity.connections -= 1

    # -- /status ------------------------------------------------------------------

    async def status(self, request: web.Request) -> web.StreamResponse:
        admitted = self._admit(request, "probe")
        if isinstance(admitted, web.Response):
            return admitted
        job_id, attempt = admitted
        refused = await self._gone_or_stale(job_id, attempt, fresh=True)
        if refused is not None:
            if refused.status == 404:
                self._activity.pop(job_id, None)
                self._upstreams.pop(job_id, None)
            return refused
        found = await self._current(job_id)
        upstream = found[0] if found is not None else None
        # A job with no server (a terminal session) is ready once it runs.
        ready = True if upstream is None else await _accepts(URL(upstream))
        activity = self._activity.get(job_id, JobActivity())
        return web.json_response(
            {"ready": ready, "last_activity": activity.last, "connections": activity.connections}
        )

    # -- /proxy -------------------------------------------------------------------

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        admitted = self._admit(request, "http")
        if isinstance(admitted, web.Response):
            return admitted
        job_id, attempt = admitted
        refused = await self._gone_or_stale(job_id, attempt)
        if refused is not None:
            return refused
        found = await self._current(job_id)
        upstream = found[0] if found is not None else None
        if upstream is None:
            return _error(
                404, "no_server", f"job {job_id} runs no server to proxy (not a Jupyter session)"
            )
        # The raw path, still percent-encoded: Jupyter's file paths hold %2F.
        prefix = f"/jobs/{request.match_info['job_id']}/proxy/"
        path, _, query = request.raw_path.partition("?")
        rest = path[len(prefix) :]
        target = URL(f"{upstream}/{rest}" + (f"?{query}" if query else ""), encoded=True)
        headers = _forwarded(request)
        # The portal's idle culler reading the server's own status is not activity.
        touch = (
            (lambda: None)
            if request.headers.get(tickets.PROBE_HEADER)
            else (lambda: self._touch(job_id))
        )
        if _is_websocket(request):
            return await self._proxy_websocket(request, job_id, target, headers)
        try:
            upstream_response = await self.client.request(
                request.method,
                target,
                headers=headers,
                data=request.content if request.body_exists else None,
                allow_redirects=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            )
        except aiohttp.ClientConnectorError as exc:
            self._upstreams.pop(job_id, None)
            return _not_ready(job_id, exc)
        except aiohttp.ClientError as exc:
            return _error(502, "upstream_failed", f"job {job_id}'s server failed: {exc}")
        touch()
        async with upstream_response:
            response = web.StreamResponse(
                status=upstream_response.status,
                reason=upstream_response.reason,
                headers=_response_headers(upstream_response.headers),
            )
            await response.prepare(request)
            async for chunk in upstream_response.content.iter_any():
                await response.write(chunk)
                touch()
            await response.write_eof()
        return response

    async def _proxy_websocket(
        self, request: web.Request, job_id: int, target: URL, headers: CIMultiDict[str]
    ) -> web.StreamResponse:
        protocols = [
            p.strip()
            for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")
            if p.strip()
        ]
        for name in list(headers):
            if name.lower() in _WS_HANDSHAKE:
                del headers[name]
        try:
            upstream_ws = await self.client.ws_connect(
                target.with_scheme("wss" if target.scheme == "https" else "ws"),
                headers=headers,
                protocols=protocols,
                autoping=True,
                max_msg_size=MAX_WS_MESSAGE,
            )
        except aiohttp.WSServerHandshakeError as exc:
            return _error(
                exc.status if 400 <= exc.status < 600 else 502,
                "upstream_refused",
                f"job {job_id}'s server refused the WebSocket: {exc.message}",
            )
        except aiohttp.ClientConnectorError as exc:
            self._upstreams.pop(job_id, None)
            return _not_ready(job_id, exc)
        except aiohttp.ClientError as exc:
            return _error(502, "upstream_failed", f"job {job_id}'s server failed: {exc}")
        self._touch(job_id)
        client_ws = web.WebSocketResponse(
            protocols=[upstream_ws.protocol] if upstream_ws.protocol else (),
            autoping=True,
            max_msg_size=MAX_WS_MESSAGE,
        )
        await client_ws.prepare(request)
        with self._connection(job_id):
            await _pump_both(client_ws, upstream_ws, touch=lambda: self._touch(job_id))
        return client_ws

    # -- /exec --------------------------------------------------------------------

    async def exec(self, request: web.Request) -> web.StreamResponse:
        admitted = self._admit(request, "exec")
        if isinstance(admitted, web.Response):
            return admitted
        job_id, attempt = admitted
        try:
            cols = _size(request.query.get("cols"), 80)
            rows = _size(request.query.get("rows"), 24)
        except ValueError as exc:
            return _error(400, "bad_size", str(exc))
        refused = await self._gone_or_stale(job_id, attempt, fresh=True)
        if refused is not None:
            return refused
        if not _is_websocket(request):
            return _error(400, "not_websocket", "open /exec as a WebSocket (Upgrade: websocket)")
        try:
            shell: ExecSession | None = await self._blocking(
                self.runtime.exec_shell, job_id, cols, rows
            )
        except ExecRefused as exc:
            return _error(502, "exec_failed", str(exc))
        if shell is None:
            return _unknown(job_id)
        ws = web.WebSocketResponse(autoping=True, max_msg_size=MAX_WS_MESSAGE)
        try:
            await ws.prepare(request)
            self._touch(job_id)
            with self._connection(job_id):
                await _terminal(ws, shell, touch=lambda: self._touch(job_id))
        finally:
            await self._blocking(shell.close)
        return ws


# -- helpers ----------------------------------------------------------------------


def _unknown(job_id: int) -> web.Response:
    return _error(404, "unknown_job", f"job {job_id} is not running on this node")


def _not_ready(job_id: int, exc: Exception) -> web.Response:
    return _error(
        503,
        "not_ready",
        f"job {job_id}'s server does not accept connections yet ({exc}); try again shortly",
        **{"Retry-After": str(RETRY_AFTER_S)},
    )


def _size(raw: str | None, default: int) -> int:
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_TERMINAL_SIZE:
        raise ValueError(f"cols and rows must be integers from 1 to {MAX_TERMINAL_SIZE}")
    return int(raw)


def _is_websocket(request: web.Request) -> bool:
    return (
        request.headers.get("Upgrade", "").lower() == "websocket"
        and "upgrade" in request.headers.get("Connection", "").lower()
    )


def _hop_by_hop(headers: CIMultiDictProxy[str]) -> frozenset[str]:
    named = {h.strip().lower() for h in headers.get("Connection", "").split(",") if h.strip()}
    return HOP_BY_HOP | named


def _forwarded(request: web.Request) -> CIMultiDict[str]:
    """The request's headers for the server: no hop-by-hop header, no ticket; X-Forwarded-*.

    Host is kept as the portal sent it: Jupyter compares a WebSocket's Origin with it.
    """
    drop = _hop_by_hop(request.headers)
    headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in drop)
    peer = request.remote or ""
    prior = request.headers.get("X-Forwarded-For")
    headers["X-Forwarded-For"] = f"{prior}, {peer}" if prior else peer
    headers.setdefault("X-Forwarded-Proto", request.scheme)
    headers.setdefault("X-Forwarded-Host", request.host)
    return headers


def _response_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    drop = _hop_by_hop(headers)
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in drop)


async def _accepts(upstream: URL) -> bool:
    """Whether the server accepts a TCP connection now."""
    try:
        _reader, writer = await asyncio.wait_for(
            asyncio.open_connection(upstream.host, upstream.port), _PROBE_TIMEOUT_S
        )
    except (TimeoutError, OSError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def _pump_both(
    client_ws: web.WebSocketResponse,
    upstream_ws: aiohttp.ClientWebSocketResponse,
    *,
    touch: Callable[[], None],
) -> None:
    """Relay frames both ways until either side closes; then close the other with its code."""

    async def relay(
        source: AsyncIterable[aiohttp.WSMessage],
        send_str: Callable[[str], Awaitable[None]],
        send_bytes: Callable[[bytes], Awaitable[None]],
    ) -> None:
        async for message in source:
            touch()
            if message.type == WSMsgType.TEXT:
                await send_str(message.data)
            elif message.type == WSMsgType.BINARY:
                await send_bytes(message.data)
            else:  # ERROR; CLOSE ends the iteration
                break

    to_upstream = asyncio.ensure_future(
        relay(client_ws, upstream_ws.send_str, upstream_ws.send_bytes)
    )
    to_client = asyncio.ensure_future(relay(upstream_ws, client_ws.send_str, client_ws.send_bytes))
    try:
        await asyncio.wait({to_upstream, to_client}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (to_upstream, to_client):
            task.cancel()
        await asyncio.gather(to_upstream, to_client, return_exceptions=True)
        upstream_code = upstream_ws.close_code
        client_code = client_ws.close_code
        await upstream_ws.close(code=client_code or aiohttp.WSCloseCode.OK)
        await client_ws.close(code=upstream_code or aiohttp.WSCloseCode.OK)


async def _terminal(
    ws: web.WebSocketResponse, shell: ExecSession, *, touch: Callable[[], None]
) -> None:
    """Relay a shell's terminal and a WebSocket until either ends."""
    loop = asyncio.get_running_loop()
    output: asyncio.Queue[bytes | None] = asyncio.Queue()
    paused = False

    def readable() -> None:
        nonlocal paused
        try:
            data = _read(shell.fd)
        except BlockingIOError:
            return
        if not data:
            loop.remove_reader(shell.fd)
            output.put_nowait(None)
            return
        output.put_nowait(data)
        if output.qsize() >= _TERMINAL_BACKLOG:
            # The browser is slow: stop reading until it catches up (the pty then
            # blocks the shell's writes, as a slow terminal would).
            loop.remove_reader(shell.fd)
            paused = True

    async def to_client() -> None:
        nonlocal paused
        while True:
            data = await output.get()
            if data is None:
                return
            await ws.send_bytes(data)
            if paused and output.qsize() < _TERMINAL_BACKLOG // 2:
                paused = False
                loop.add_reader(shell.fd, readable)

    async def to_shell() -> None:
        async for message in ws:
            if message.type == WSMsgType.BINARY:
                touch()
                await _write_all(loop, shell.fd, message.data)
            elif message.type == WSMsgType.TEXT:
                size = _resize(message.data)
                if size is None:
                    await ws.send_str(
                        json.dumps({"error": 'a text frame must be {"resize": [cols, rows]}'})
                    )
                else:
                    shell.resize(*size)
            else:
                return

    loop.add_reader(shell.fd, readable)
    tasks = [asyncio.ensure_future(to_client()), asyncio.ensure_future(to_shell())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        loop.remove_reader(shell.fd)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await ws.close()


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, _READ_CHUNK)
    except BlockingIOError:
        raise
    except OSError:
        return b""  # EIO: the pty's last process has gone


async def _write_all(loop: asyncio.AbstractEventLoop, fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            await _writable(loop, fd)
            continue
        except OSError:
            return  # the shell has gone; the reader ends the session
        view = view[written:]


async def _writable(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_writer(fd, wake)
    try:
        await ready
    finally:
        loop.remove_writer(fd)


def _resize(text: str) -> tuple[int, int] | None:
    try:
        value = json.loads(text)
        cols, rows = value["resize"]
    except (ValueError, KeyError, TypeError):
        return None
    if not all(isinstance(n, int) and 1 <= n <= MAX_TERMINAL_SIZE for n in (cols, rows)):
        return None
    return cols, rows


class GatewayServer:
    """The gateway in a thread of its own, with its own event loop."""

    def __init__(self, gateway: Gateway, host: str, port: int) -> None:
        self.gateway = gateway
        self.host = host
        self.port = port
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        """Listen, or raise ``OSError`` (the port is taken, the address is not this host's)."""
        self._thread = threading.Thread(target=self._serve, name="agent-gateway", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise self._error

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._listen())
        except BaseException as exc:
            self._error = exc
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()

    async def _listen(self) -> None:
        self._runner = web.AppRunner(self.gateway.app(), access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        if self.port == 0:
            server = site._server
            sockets = getattr(server, "sockets", None) or []
            self.port = int(sockets[0].getsockname()[1])
        log.info("gateway listening on %s", self.url)

    def stop(self) -> None:
        if self._thread is None:
            return

        async def shutdown() -> None:
            if self._runner is not None:
                await self._runner.cleanup()

        with contextlib.suppress(RuntimeError):
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._thread = None

"""The authenticated path from the browser to a session's server and to a job's shell (ASGI).

``labportal.asgi`` sends two kinds of path here, HTTP and WebSocket alike:
- ``/sessions/<job>/<rest>``: the session's own server (JupyterLab, whose base URL is
  ``/sessions/<job>/``), through ``{gateway}/jobs/<job>/proxy/sessions/<job>/<rest>``;
- ``/jobs/<job>/terminal/ws``: a shell in any running job, through ``{gateway}/jobs/<job>/exec``.

Each request is authenticated with the portal's session cookie (the job's owner or
staff), a request that could change something must come from the portal's own pages
(Origin, as Django's CSRF check does for HTTPS), and the node's gateway is given a
ticket for that job and purpose. The session's token is added upstream and never
sent back. Bodies are streamed both ways; WebSocket messages are relayed one by one.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from http.cookies import SimpleCookie
from importlib import import_module
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib import auth
from django.shortcuts import resolve_url
from django.utils import translation
from django.utils.translation.trans_real import parse_accept_lang_header

from protocol import tickets
from sessions.errors import BadOrigin, NotSignedIn
from sessions.selectors import GatewayTarget, gateway_target, job_reachable_by

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

SESSION_PATH = re.compile(r"^/sessions/(?P<job>\d+)(?P<rest>/.*)?$")
TERMINAL_PATH = re.compile(r"^/jobs/(?P<job>\d+)/terminal/ws$")
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
# Never sent upstream: the portal's own credentials, the ticket a browser might forge,
# the Origin the portal has checked (the server behind would compare it with its own host).
NOT_FORWARDED = HOP_BY_HOP | {
    "cookie",
    "origin",
    "authorization",
    tickets.HEADER.lower(),
    tickets.PROBE_HEADER.lower(),
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-extensions",
    "sec-websocket-protocol",
}
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
CONNECT_TIMEOUT_S = 10.0
CHUNK = 64 * 1024


def handles(path: str) -> bool:
    """Whether ``labportal.asgi`` routes this path here."""
    return bool(SESSION_PATH.match(path) or TERMINAL_PATH.match(path))


class _Client:
    """One aiohttp client per event loop (a process has one; the tests make several)."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            self._session = aiohttp.ClientSession(
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
            self._loop = loop
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


client = _Client()


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "http":
        await _http(scope, receive, send)
    elif scope["type"] == "websocket":
        await _websocket(scope, receive, send)


# --- who asks, and for what -------------------------------------------------------------


def _headers(scope: Scope) -> list[tuple[str, str]]:
    return [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]]


def _header(scope: Scope, name: str) -> str | None:
    for key, value in _headers(scope):
        if key == name:
            return value
    return None


def _cookies(scope: Scope) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    for key, value in _headers(scope):
        if key == "cookie":
            try:
                jar.load(value)
            except Exception:  # a malformed cookie header: treat as no cookie
                continue
    return {name: morsel.value for name, morsel in jar.items()}


def _user_for(cookies: dict[str, str]) -> Any:
    """The signed-in user of this cookie (or AnonymousUser), as Django's middleware finds it."""
    engine = import_module(settings.SESSION_ENGINE)
    store = engine.SessionStore(session_key=cookies.get(settings.SESSION_COOKIE_NAME))
    return auth.get_user(SimpleNamespace(session=store))  # type: ignore[arg-type]


def _origin_ok(scope: Scope) -> bool:
    """The request comes from the portal's own pages: its Origin (or, lacking one, its
    Referer) names the host it was sent to, or a CSRF_TRUSTED_ORIGINS entry."""
    source = _header(scope, "origin") or _header(scope, "referer")
    if not source:
        return False
    parts = urlsplit(source)
    origin = f"{parts.scheme}://{parts.netloc}"
    return parts.netloc == (_header(scope, "host") or "") or origin in set(
        settings.CSRF_TRUSTED_ORIGINS
    )


# A page of JupyterLab makes dozens of requests at once: who asks and where the job is
# are looked up once per sign-in, job and purpose, and trusted for AUTH_TTL_S (a signed-out
# or moved member keeps the path that long at most; the gateway refuses an ended job at
# once, and the ticket, valid for a minute, is older than AUTH_TTL_S at worst).
AUTH_TTL_S = 5.0
_AUTH_CACHE_SIZE = 1024
_recent: OrderedDict[tuple[str, int, str], tuple[float, Any, GatewayTarget]] = OrderedDict()
_recent_lock = threading.Lock()


def _target_sync(
    scope: Scope, job_id: int, purpose: tickets.Purpose, rest: str
) -> tuple[Any, GatewayTarget]:
    cookies = _cookies(scope)
    translation.activate(_language(scope))
    key = (cookies.get(settings.SESSION_COOKIE_NAME, ""), job_id, purpose)
    now = time.monotonic()
    with _recent_lock:
        hit = _recent.get(key) if key[0] else None
    if hit is not None and now - hit[0] < AUTH_TTL_S:
        user, base = hit[1], hit[2]
    else:
        user = _user_for(cookies)
        job = job_reachable_by(user, job_id)
        base = gateway_target(job, purpose=purpose, username=user.username, rest="")
        if key[0]:
            with _recent_lock:
                _recent[key] = (now, user, base)
                _recent.move_to_end(key)
                while len(_recent) > _AUTH_CACHE_SIZE:
                    _recent.popitem(last=False)
    if purpose != "http":
        return user, base
    # The job's prefix (".../proxy/" or the server's "/") and the request's own path.
    return user, replace(base, url=base.url + rest.lstrip("/"))


_target = sync_to_async(_target_sync, thread_sensitive=False)


def _language(scope: Scope) -> str:
    """The language the portal's pages use for this browser (its cookie, else its header)."""
    chosen = _cookies(scope).get(settings.LANGUAGE_COOKIE_NAME)
    if chosen and translation.check_for_language(chosen):
        return chosen
    for code, _quality in parse_accept_lang_header(_header(scope, "accept-language") or ""):
        try:
            return translation.get_supported_language_variant(code)
        except LookupError:
            continue
    return settings.LANGUAGE_CODE


def _upstream_headers(scope: Scope, target: GatewayTarget) -> dict[str, str]:
    headers: dict[str, str] = {}
    for key, value in _headers(scope):
        if key not in NOT_FORWARDED:
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
    cookie = _upstream_cookie(_cookies(scope))
    if cookie:
        headers["cookie"] = cookie
    headers.update(target.headers)
    return headers


def _upstream_cookie(cookies: dict[str, str]) -> str:
    """The browser's cookies less the portal's own (the session's server never sees them)."""
    own = {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME, settings.LANGUAGE_COOKIE_NAME}
    return "; ".join(f"{k}={v}" for k, v in cookies.items() if k not in own)


def _query(scope: Scope) -> str:
    raw: bytes = scope.get("query_string", b"")
    return f"?{raw.decode('latin-1')}" if raw else ""


def _route(scope: Scope) -> tuple[int, tickets.Purpose, str] | None:
    path: str = scope["path"]
    found = SESSION_PATH.match(path)
    if found:
        # The gateway gets the browser's path unchanged: the server's base URL is /sessions/<job>/.
        raw = scope.get("raw_path") or path.encode()
        return int(found["job"]), "http", raw.decode("latin-1").lstrip("/")
    found = TERMINAL_PATH.match(path)
    if found and scope["type"] == "websocket":
        return int(found["job"]), "exec", ""
    return None


# --- HTTP ------------------------------------------------------------------------------


async def _answer(
    send: Send, status: int, text: str, headers: list[tuple[str, str]] | None = None
) -> None:
    body = (text + "\n").encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
                *((k.encode(), v.encode()) for k, v in headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _request_body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


async def _http(scope: Scope, receive: Receive, send: Send) -> None:
    route = _route(scope)
    if route is None:
        await _answer(send, 404, "Not found.")
        return
    job_id, purpose, rest = route
    method = scope["method"].upper()
    try:
        if method not in SAFE_METHODS and not _origin_ok(scope):
            raise BadOrigin(
                "This request did not come from the portal's pages (Origin), so it was refused."
            )
        _user, target = await _target(scope, job_id, purpose, rest)
    except NotSignedIn:
        login = resolve_url(settings.LOGIN_URL)
        await _answer(
            send, 302, "Sign in first.", [("location", f"{login}?next={quote(scope['path'])}")]
        )
        return
    except Exception as exc:
        if not hasattr(exc, "close_code"):
            raise
        await _answer(send, exc.status_code, str(exc.message))  # type: ignore[attr-defined]
        return
    headers = _upstream_headers(scope, target)
    has_body = any(k == "content-length" and v != "0" for k, v in _headers(scope)) or any(
        k == "transfer-encoding" for k, _ in _headers(scope)
    )
    try:
        async with client.get().request(
            method,
            target.url + _query(scope),
            headers=headers,
            data=_request_body(receive) if has_body else None,
            allow_redirects=False,
        ) as upstream:
            await send(
                {
                    "type": "http.response.start",
                    "status": upstream.status,
                    "headers": _response_headers(upstream.headers.items(), job_id),
                }
            )
            async for chunk in upstream.content.iter_chunked(CHUNK):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
    except aiohttp.ClientError as exc:
        log.warning("gateway for job %s: %s", job_id, exc)
        await _answer(send, 502, "The node's gateway did not answer; try again in a moment.")


def _response_headers(headers: Any, job_id: int) -> list[tuple[bytes, bytes]]:
    """The server's response headers, less hop-by-hop ones, with each cookie kept to the
    session's own path: a member's server must not set cookies for the portal's pages."""
    out = []
    for key, value in headers:
        name = key.lower()
        if name in HOP_BY_HOP - {"content-length"}:
            continue
        if name == "set-cookie":
            value = _cookie_scoped(value, job_id)
        out.append((name.encode("latin-1"), value.encode("latin-1")))
    return out


def _cookie_scoped(set_cookie: str, job_id: int) -> str:
    own_path = f"/sessions/{job_id}/"
    parts = [part.strip() for part in set_cookie.split(";")]
    kept = [parts[0]]
    path = own_path
    for attribute in parts[1:]:
        name = attribute.split("=", 1)[0].strip().lower()
        if name == "domain":
            continue
        if name == "path":
            value = attribute.split("=", 1)[1].strip() if "=" in attribute else ""
            path = value if value.startswith(own_path) else own_path
            continue
        kept.append(attribute)
    return "; ".join([*kept, f"Path={path}"])


# --- WebSocket -------------------------------------------------------------------------


async def _websocket(scope: Scope, receive: Receive, send: Send) -> None:
    first = await receive()
    if first["type"] != "websocket.connect":
        return
    route = _route(scope)

    async def refuse(code: int, reason: str) -> None:
        # Accepted first, so that the browser sees the close code and reason.
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": code, "reason": reason[:120]})

    if route is None:
        await refuse(4404, "not found")
        return
    job_id, purpose, rest = route
    try:
        if not _origin_ok(scope):
            raise BadOrigin("the Origin is not the portal's")
        _user, target = await _target(scope, job_id, purpose, rest)
    except Exception as exc:
        if not hasattr(exc, "close_code"):
            raise
        await refuse(exc.close_code, str(exc.message))  # type: ignore[attr-defined]
        return
    protocols = [p.strip() for p in (_header(scope, "sec-websocket-protocol") or "").split(",")]
    try:
        upstream = await client.get().ws_connect(
            target.url + _query(scope),
            headers=_upstream_headers(scope, target),
            protocols=[p for p in protocols if p],
            autoping=True,
            max_msg_size=0,
        )
    except aiohttp.WSServerHandshakeError as exc:
        code = {403: 4403, 404: 4404, 503: 4503}.get(exc.status, 4502)
        await refuse(code, f"the gateway answered {exc.status}")
        return
    except aiohttp.ClientError as exc:
        log.warning("gateway for job %s: %s", job_id, exc)
        await refuse(4502, "the node's gateway did not answer")
        return
    accept: dict[str, Any] = {"type": "websocket.accept"}
    if upstream.protocol:
        accept["subprotocol"] = upstream.protocol
    await send(accept)
    await _relay(upstream, receive, send)


async def _relay(upstream: aiohttp.ClientWebSocketResponse, receive: Receive, send: Send) -> None:
    async def browser_to_upstream() -> None:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                await upstream.close()
                return
            if message.get("bytes") is not None:
                await upstream.send_bytes(message["bytes"])
            elif message.get("text") is not None:
                await upstream.send_str(message["text"])

    async def upstream_to_browser() -> None:
        async for message in upstream:
            if message.type == aiohttp.WSMsgType.TEXT:
                await send({"type": "websocket.send", "text": message.data})
            elif message.type == aiohttp.WSMsgType.BINARY:
                await send({"type": "websocket.send", "bytes": message.data})
            else:
                break
        code = upstream.close_code or 1000
        # Codes a server may send; the rest (1006: the line dropped) end as a normal close.
        await send({"type": "websocket.close", "code": code if 3000 <= code <= 4999 else 1000})

    tasks = [
        asyncio.ensure_future(browser_to_upstream()),
        asyncio.ensure_future(upstream_to_browser()),
    ]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        for task in done:
            if task.exception() is not None:
                log.info("websocket relay ended: %s", task.exception())
    finally:
        if not upstream.closed:
            await upstream.close()

"""A small server for the gateway's tests, run as a local-process session job.

It listens where the contract says ($LABPORTAL_SESSION_HOST:$LABPORTAL_SESSION_PORT)
and answers under /sessions/<job id>/: what it received (echo), a streamed upload's
digest, a response streamed until released, any status code, and a WebSocket echo.
"""

from __future__ import annotations

import asyncio
import hashlib
import os

from aiohttp import WSMsgType, web

BASE = f"/sessions/{os.environ['LABPORTAL_JOB_ID']}"
released = asyncio.Event()


async def echo(request: web.Request) -> web.Response:
    return web.json_response(
        {
            "method": request.method,
            "raw_path": request.raw_path,
            "headers": [[k, v] for k, v in request.headers.items()],
            "body": (await request.read()).decode(errors="replace"),
        }
    )


async def upload(request: web.Request) -> web.Response:
    digest, size = hashlib.sha256(), 0
    async for chunk in request.content.iter_any():
        digest.update(chunk)
        size += len(chunk)
    return web.json_response({"sha256": digest.hexdigest(), "size": size})


async def stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    await response.prepare(request)
    await response.write(b"first\n")
    await asyncio.wait_for(released.wait(), 30)
    released.clear()
    await response.write(b"last\n")
    await response.write_eof()
    return response


async def release(request: web.Request) -> web.Response:
    released.set()
    return web.Response(text="released")


async def status(request: web.Request) -> web.Response:
    code = int(request.match_info["code"])
    return web.Response(status=code, text=f"status {code}", headers={"X-Upstream": "yes"})


async def websocket(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(protocols=["echo.v1"])
    await ws.prepare(request)
    async for message in ws:
        if message.type == WSMsgType.TEXT:
            if message.data == "close":
                await ws.close(code=4001, message=b"asked to")
                break
            await ws.send_str(message.data)
        elif message.type == WSMsgType.BINARY:
            await ws.send_bytes(message.data)
    return ws


app = web.Application(client_max_size=0)
app.router.add_route("*", f"{BASE}/echo/{{tail:.*}}", echo)
app.router.add_post(f"{BASE}/upload", upload)
app.router.add_get(f"{BASE}/stream", stream)
app.router.add_get(f"{BASE}/release", release)
app.router.add_get(f"{BASE}/status/{{code}}", status)
app.router.add_get(f"{BASE}/ws", websocket)

if __name__ == "__main__":
    web.run_app(
        app,
        host=os.environ["LABPORTAL_SESSION_HOST"],
        port=int(os.environ["LABPORTAL_SESSION_PORT"]),
        access_log=None,
        print=None,
    )

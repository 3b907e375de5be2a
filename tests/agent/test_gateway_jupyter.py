"""A real Jupyter server as a local-process session job, reached only through the
gateway: the portal's command (per the sessions contract), /api/status, and a kernel
that runs ``print(6*7)`` over the Jupyter messaging protocol on a proxied WebSocket."""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from agent.gateway import GatewayServer
from agent.runtime.local import LocalProcessRuntime
from tests.agent.support import wait_until
from tests.agent.test_gateway import gateway, headers, run, runtime, start, status_of
from tests.asyncrun import run_coroutine

__all__ = ["gateway", "runtime"]  # the fixtures, shared with test_gateway

JUPYTER = str(Path(sys.executable).with_name("jupyter"))
TOKEN = uuid.uuid4().hex


def jupyter_command(job_id: int) -> list[str]:
    return [
        "sh",
        "-c",
        f'exec "{JUPYTER}" server --no-browser --ip="$LABPORTAL_SESSION_HOST" '
        f'--port="$LABPORTAL_SESSION_PORT" --ServerApp.base_url=/sessions/{job_id}/ '
        '--IdentityProvider.token="$LABPORTAL_SESSION_TOKEN" --ServerApp.open_browser=False'
        # The test's jobs run as its own user (see test_gateway's runtime), here maybe root;
        # the portal's jobs never do.
        + (" --allow-root" if os.geteuid() == 0 else ""),
    ]


def test_a_kernel_of_a_real_jupyter_server_runs_a_cell_through_the_gateway(
    runtime: LocalProcessRuntime, gateway: GatewayServer
) -> None:
    job_id = 51
    start(
        runtime,
        job_id,
        jupyter_command(job_id),
        env={"LABPORTAL_SESSION_TOKEN": TOKEN},
        session={"kind": "jupyter"},
    )
    wait_until(lambda: status_of(gateway, job_id)["ready"], timeout_s=60, poll_s=0.2)
    base = f"{gateway.url}/jobs/{job_id}/proxy/sessions/{job_id}"
    auth = {**headers(job_id, "http"), "Authorization": f"token {TOKEN}"}

    async def go() -> dict[str, Any]:
        async with aiohttp.ClientSession() as client:
            async with client.get(f"{base}/api/status", headers=auth) as response:
                api_status = (response.status, await response.json())
            async with client.get(f"{base}/api/status", headers=headers(job_id, "http")) as r:
                without_token = r.status
            async with client.post(f"{base}/api/kernels", headers=auth, json={}) as response:
                assert response.status == 201, await response.text()
                kernel = await response.json()
            output = await _run_cell(client, f"{base}/api/kernels/{kernel['id']}/channels", auth)
            async with client.delete(f"{base}/api/kernels/{kernel['id']}", headers=auth) as r:
                deleted = r.status
            return {
                "status": api_status,
                "without_token": without_token,
                "output": output,
                "deleted": deleted,
            }

    result = run_coroutine(go(), 90)

    assert result["status"][0] == 200 and "started" in result["status"][1]
    assert result["without_token"] == 403
    assert result["output"] == "42\n"
    assert result["deleted"] == 204


async def _run_cell(client: aiohttp.ClientSession, url: str, auth: dict[str, str]) -> str:
    msg_id = uuid.uuid4().hex
    request = {
        "header": {
            "msg_id": msg_id,
            "msg_type": "execute_request",
            "username": "alice",
            "session": uuid.uuid4().hex,
            "date": "",
            "version": "5.3",
        },
        "parent_header": {},
        "metadata": {},
        "content": {
            "code": "print(6*7)",
            "silent": False,
            "store_history": False,
            "user_expressions": {},
            "allow_stdin": False,
        },
        "channel": "shell",
        "buffers": [],
    }
    output = ""
    async with client.ws_connect(url, headers=auth) as ws:
        await ws.send_str(json.dumps(request))
        while True:
            message = await ws.receive(timeout=30)
            assert message.type == aiohttp.WSMsgType.TEXT, message
            reply = json.loads(message.data)
            if reply.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if reply["msg_type"] == "stream":
                output += reply["content"]["text"]
            if reply["msg_type"] == "status" and reply["content"]["execution_state"] == "idle":
                return output


_ = run  # the shared helper, for symmetry with test_gateway

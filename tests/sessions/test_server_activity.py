"""The idle culler reads a real JupyterLab's own account, as JupyterHub's culler does:
a kernel running a cell is use even with nobody connected, and a cell that ends after
the browser left counts from its end. The server runs under the local-process runtime
behind the node's real gateway, reached with the portal's tickets."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import aiohttp
import pytest
import requests
from django.utils import timezone

from agent.gateway import Gateway, GatewayServer
from agent.runtime import JobSpec
from agent.runtime.local import LocalProcessRuntime
from alerts.models import Alert, AlertRule, Kind
from alerts.services import alerts_evaluate
from cluster.models import Node, NodeToken
from jobqueue.models import Job
from sessions.launch import JUPYTER_COMMAND, TOKEN_ENV, session_token
from sessions.selectors import gateway_target
from sessions.status import SessionStatus, session_status
from tests.agent.support import job_spec, wait_until
from tests.asyncrun import run_coroutine
from tests.sessions.conftest import running_session

pytestmark = pytest.mark.django_db(transaction=True)
CELL_S = 6


@pytest.fixture
def jupyter_session(
    cluster: Any, alice: Any, image: Any, runtime: LocalProcessRuntime
) -> Iterator[Job]:
    """A running jupyter session of alice's: a real JupyterLab behind gpu01's gateway."""
    _token, secret = NodeToken.issue(node_name="gpu01")
    server = GatewayServer(Gateway(node="gpu01", token=secret, runtime=runtime), "127.0.0.1", 0)
    server.start()
    try:
        job = running_session(alice, image)
        Node.objects.filter(name="gpu01").update(gateway_url=server.url)
        job.refresh_from_db()
        # This interpreter's jupyter, whatever the PATH of the test run; the runtime runs
        # it as this test's user (root in CI), which Jupyter allows only when told.
        allow_root = " --allow-root" if os.geteuid() == 0 else ""
        command = JUPYTER_COMMAND.replace(
            "exec jupyter lab", f"exec {sys.executable} -m jupyter lab{allow_root}"
        )
        spec = job_spec(
            job.pk,
            command=["/bin/sh", "-c", command],
            session={"kind": "jupyter", "port": 8888},
            attempt=job.dispatch_count,
            env={TOKEN_ENV: session_token(job_id=job.pk, attempt=job.dispatch_count)},
            time_limit_s=300,
        )
        runtime.start(JobSpec.from_wire(spec))
        wait_until(lambda: session_status(job, username="test").ready, timeout_s=90, poll_s=0.5)
        yield job
    finally:
        runtime.close()
        server.stop()


def _gateway_last_activity(job: Job) -> float | None:
    """The gateway's own account (what went through it), without the server's."""
    target = gateway_target(job, purpose="probe", username="test")
    last = requests.get(target.url, headers=target.headers, timeout=5).json()["last_activity"]
    return float(last) if last is not None else None


def _run_a_quiet_cell_and_leave(job: Job) -> float:
    """Start a kernel, send it a cell that sleeps CELL_S seconds and prints nothing, see
    it busy, and close the connection as a member closing the laptop would."""
    kernels = gateway_target(
        job, purpose="http", username="test", rest=f"sessions/{job.pk}/api/kernels"
    )
    answer = requests.post(
        kernels.url, headers=kernels.headers, json={"name": "python3"}, timeout=30
    )
    assert answer.status_code == 201, answer.text
    kernel_id = answer.json()["id"]
    channels = gateway_target(
        job,
        purpose="http",
        username="test",
        rest=f"sessions/{job.pk}/api/kernels/{kernel_id}/channels",
    )
    session = uuid.uuid4().hex
    msg_id = uuid.uuid4().hex
    message: dict[str, Any] = {
        "header": {
            "msg_id": msg_id,
            "session": session,
            "username": "alice",
            "msg_type": "execute_request",
            "version": "5.3",
            "date": timezone.now().isoformat(),
        },
        "parent_header": {},
        "metadata": {},
        "content": {
            "code": f"import time; time.sleep({CELL_S})",
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        },
        "channel": "shell",
        "buffers": [],
    }

    async def go() -> float:
        async with (
            aiohttp.ClientSession() as client,
            client.ws_connect(
                channels.url.replace("http://", "ws://"), headers=channels.headers
            ) as ws,
        ):
            await ws.send_str(json.dumps(message))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                frame = await asyncio.wait_for(ws.receive(), 60)
                data = json.loads(frame.data)
                parent = data.get("parent_header", {}).get("msg_id")
                if (
                    data.get("msg_type") == "status"
                    and parent == msg_id
                    and data["content"]["execution_state"] == "busy"
                ):
                    return time.time()
            raise AssertionError("the kernel never said it was busy")

    return run_coroutine(go(), 90)


def test_a_quiet_cell_keeps_the_session_in_use_and_it_counts_from_the_cells_end(
    jupyter_session: Job,
) -> None:
    job = jupyter_session
    AlertRule.objects.create(kind=Kind.IDLE_SESSION, threshold=0, window_s=600, grace_s=600)
    before = session_status(job, username="test")
    assert before.ready and not before.busy and before.last_activity is not None

    busy_at = _run_a_quiet_cell_and_leave(job)
    running: SessionStatus = session_status(job, username="test")
    assert running.busy, running
    # Two hours on, with nothing through the proxy: a busy kernel is use, never culled.
    alerts_evaluate(now=timezone.now() + timedelta(hours=2))
    assert not Alert.objects.filter(kind=Kind.IDLE_SESSION).exists()

    wait_until(lambda: not session_status(job, username="test").busy, timeout_s=60, poll_s=0.5)
    after = session_status(job, username="test")
    gateway_last = _gateway_last_activity(job)
    assert gateway_last is not None and after.last_activity is not None
    # The server's account saw the cell end; the gateway saw nothing after the member left.
    assert after.last_activity >= busy_at + CELL_S - 1 > gateway_last
    # Reading the status is not use: the gateway's account did not move.
    assert _gateway_last_activity(job) == gateway_last

"""Interactive sessions on the real stack: PostgreSQL, Redis, the web tier under uvicorn
(Django and the sessions proxy), a control worker, and an agent with its gateway, once
with the local-process runtime and once with Docker (JupyterLab in a container on the
internal sessions network, from an image built here). A member starts JupyterLab from the web form, runs a cell
through the proxy and reads its output; opens the session's terminal and reads a
command's output in xterm.js; another member gets 403 on the same URLs, HTTP and
WebSocket. Set LABPORTAL_SCREENS_DIR to keep screenshots."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone
from playwright.sync_api import expect

from accounts.models import Notification
from alerts.models import Alert, AlertRule, Kind
from alerts.services import alerts_evaluate
from cluster.models import Gpu, Node, NodeToken
from jobqueue.models import ContainerImage, Job
from labportal.devstack import Stack, free_port, wait_for_port
from tests.browser.test_alerts import shot
from tests.conftest import PASSWORD, require_in_ci
from tests.e2e.test_jobs_end_to_end import docker_ready, stack_env, wait_until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.browser,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
]

IMAGE = "labportal/demo-local"  # the local runtime ignores it; the allowlist does not
# JupyterLab in a container, built locally by .ci/jupyter-image.sh from deploy/images/jupyter.
JUPYTER_IMAGE = "labportal/jupyter:test"
RUNTIMES = ["local", pytest.param("docker", marks=pytest.mark.docker)]
LANGUAGES = (("en", "en-US"), ("zh-hans", "zh-CN"))


def members_may_run_jupyter() -> bool:
    """As root, the local runtime drops a job to its member's uid: that uid must be able
    to run this environment's interpreter (not one under a private /root)."""
    if os.geteuid() != 0:
        return True
    probe = [sys.executable, "-c", "import jupyterlab, ipykernel"]
    return subprocess.run(probe, user=65534, group=65534, check=False).returncode == 0


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> str:
    """The agent's runtime: local processes (the demo's) and Docker (the product's)."""
    return str(request.param)


@pytest.fixture
def stack(tmp_path: Path, runtime: str) -> Any:
    if not settings.CELERY_BROKER_URL.startswith("redis://"):
        require_in_ci("a Redis broker (CELERY_BROKER_URL=redis://…)")
    if runtime == "local" and not members_may_run_jupyter():
        require_in_ci(f"{sys.executable} with jupyterlab, runnable by other uids (chmod o+x)")
    if runtime == "docker" and not docker_ready(JUPYTER_IMAGE):
        require_in_ci(f"a Docker engine with the image {JUPYTER_IMAGE} (bash .ci/jupyter-image.sh)")
    # pytest's folders are 0700; as root, the job runs as its member, who must reach its own.
    for folder in (tmp_path, *tmp_path.parents[:2]):
        folder.chmod(folder.stat().st_mode | 0o011)
    running = Stack(env=stack_env(tmp_path), log_dir=tmp_path / "logs")
    yield running
    running.stop()


def signed_in(browser: Any, base: str, username: str, *, language: str = "en") -> Any:
    context = browser.new_context(locale="en-US")
    context.add_cookies([{"name": settings.LANGUAGE_COOKIE_NAME, "value": language, "url": base}])
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{base}/accounts/login/")
    page.fill("input[name=login]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_load_state()
    return page


def websocket_outcome(page: Any, url: str) -> Any:
    """Dial a WebSocket from the page (its cookies, its Origin): the first message it got
    (or none) and the close code; the owner's is closed by the page after that message."""
    return page.evaluate(
        """url => new Promise(done => {
            const ws = new WebSocket(url);
            ws.binaryType = "arraybuffer";
            let message = false;
            ws.onmessage = () => { message = true; ws.close(1000); };
            ws.onclose = event => done({message, code: event.code, reason: event.reason});
            setTimeout(() => done({message, code: null}), 20000);
        })""",
        url,
    )


def test_a_member_runs_a_cell_and_a_shell_in_a_session_and_another_member_is_refused(
    stack: Stack,
    runtime: str,
    browser: Any,
    alice: Any,
    bob: Any,
    queues: Any,
    tmp_path: Path,
) -> None:
    node_name = f"e2e-{uuid.uuid4().hex[:6]}"
    _token, secret = NodeToken.issue(node_name=node_name)
    ContainerImage.objects.create(reference=JUPYTER_IMAGE if runtime == "docker" else IMAGE)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    stack.web(port)
    stack.control_worker(tmp_path / "beat-schedule", concurrency=2)
    stack.agent(
        name=node_name,
        token=secret,
        broker=settings.CELERY_BROKER_URL,
        runtime=runtime,
        gpus=1,
        state_dir=tmp_path / "agent",
        gateway=f"127.0.0.1:{free_port()}",
    )
    wait_until(
        lambda: (
            Node.objects.filter(name=node_name, state=Node.State.UP)
            .exclude(gateway_url="")
            .exists()
            and Gpu.objects.filter(node__name=node_name).count() == 1
        ),
        timeout_s=90,
        stack=stack,
        what="the agent to register its simulated GPU and its gateway",
    )
    wait_for_port(port)

    page = signed_in(browser, base, alice.username)
    page.goto(f"{base}/sessions/new/")
    page.get_by_test_id("session-start").click()
    state = page.get_by_test_id("session-state")
    expect(state).to_be_visible()
    job = Job.objects.get(owner=alice)
    assert job.kind == Job.Kind.JUPYTER
    wait_until(
        lambda: Job.objects.get(pk=job.pk).state == Job.State.RUNNING,
        timeout_s=60,
        stack=stack,
        what="the session to start",
    )
    expect(state).to_have_attribute("data-ready", re.compile("1"), timeout=120_000)
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING, (job.state, job.end_reason)
    for language, _locale in LANGUAGES:
        for width in (1366, 390):
            page.context.add_cookies(
                [{"name": settings.LANGUAGE_COOKIE_NAME, "value": language, "url": base}]
            )
            page.set_viewport_size({"width": width, "height": 900})
            page.reload()
            expect(page.get_by_test_id("session-open")).to_be_visible()
            shot(page, f"session-ready-{runtime}-{language}-{width}")
    page.context.add_cookies([{"name": settings.LANGUAGE_COOKIE_NAME, "value": "en", "url": base}])
    page.set_viewport_size({"width": 1366, "height": 900})
    page.reload()

    # JupyterLab through the proxy: a new notebook, a cell that prints, its output.
    page.get_by_test_id("session-open").click()
    page.wait_for_url(re.compile(rf"/sessions/{job.pk}/lab"))
    page.locator('.jp-LauncherCard[data-category="Notebook"]').first.click(timeout=120_000)
    # The kernel answers through the proxy's WebSocket before the cell is typed.
    expect(page.get_by_text(re.compile(r"\| Idle"))).to_be_visible(timeout=120_000)
    cell = page.locator(".jp-Notebook .jp-Cell .cm-content").first
    cell.click()
    cell.press_sequentially("print('answer', 6 * 7)")
    expect(cell).to_contain_text("print('answer', 6 * 7)")
    page.keyboard.press("Shift+Enter")
    output = page.locator(".jp-OutputArea-output").first
    expect(output).to_have_text(re.compile(r"answer 42"), timeout=120_000)
    shot(page, f"jupyterlab-{runtime}-1366")
    page.set_viewport_size({"width": 390, "height": 900})
    shot(page, f"jupyterlab-{runtime}-390")
    page.set_viewport_size({"width": 1366, "height": 900})

    # The session's terminal: a shell next to the server, in xterm.js over the proxy.
    for language, _locale in LANGUAGES:
        for width in (1366, 390):
            page.context.add_cookies(
                [{"name": settings.LANGUAGE_COOKIE_NAME, "value": language, "url": base}]
            )
            page.set_viewport_size({"width": width, "height": 900})
            page.goto(f"{base}/jobs/{job.pk}/terminal/")
            rows = page.locator(".xterm-rows")
            expect(rows).to_be_visible()
            # Readable: xterm.js's own theme <style> is refused by the CSP; portal.css's holds.
            expect(rows).to_have_css("color", "rgb(255, 255, 255)")
            page.locator(".xterm").click()
            page.wait_for_timeout(500)  # the shell's prompt
            page.keyboard.type(f"echo shell-$((6 * 7))-{width} && pwd\n")
            expect(rows).to_contain_text(f"shell-42-{width}", timeout=30_000)
            shot(page, f"terminal-output-{runtime}-{language}-{width}")

    # Another member: 403 on the session's pages and its proxy, HTTP and WebSocket.
    other = signed_in(browser, base, bob.username)
    for path in (
        f"/sessions/{job.pk}/lab",
        f"/sessions/{job.pk}/api/kernels",
        f"/jobs/{job.pk}/session/",
        f"/jobs/{job.pk}/terminal/",
    ):
        assert other.request.get(f"{base}{path}").status == 403, path
    ws_base = base.replace("http://", "ws://")
    # The proxy refuses before it dials the gateway: a 4403 close, not one byte relayed.
    for path in (f"/jobs/{job.pk}/terminal/ws", f"/sessions/{job.pk}/api/events/subscribe"):
        seen = websocket_outcome(other, f"{ws_base}{path}")
        assert seen["code"] == 4403 and not seen["message"], (path, seen)
    # The owner's WebSocket to the same terminal relays the shell (the refusal is about who asks).
    mine = websocket_outcome(page, f"{ws_base}/jobs/{job.pk}/terminal/ws")
    assert mine["message"] and mine["code"] == 1000, mine
    other.context.close()
    page.context.close()

    # Left idle: warned at the idle-session rule's window, stopped after its grace, by the
    # real path (the culler reads the gateway and JupyterLab's own status; the stop goes
    # to the agent), with the end reason `idle`.
    AlertRule.objects.update_or_create(
        kind=Kind.IDLE_SESSION, defaults={"threshold": 0, "window_s": 600, "grace_s": 300}
    )
    now = timezone.now()
    alerts_evaluate(now=now + timedelta(minutes=11))
    warning = Alert.objects.get(kind=Kind.IDLE_SESSION, job_id=job.pk)
    assert warning.action_taken_at is None
    assert Notification.objects.filter(user=alice, kind="alert_idle_session").exists()
    assert Job.objects.get(pk=job.pk).state == Job.State.RUNNING
    alerts_evaluate(now=now + timedelta(minutes=17))
    wait_until(
        lambda: Job.objects.get(pk=job.pk).state != Job.State.RUNNING,
        timeout_s=90,
        stack=stack,
        what="the idle session to be stopped",
    )
    job.refresh_from_db()
    assert job.end_reason == "idle", (job.state, job.end_reason)

"""Benchmark: time from "start session" to a usable notebook, against the same Jupyter
server started by hand, on an idle demo-like stack (local-process runtime).

    DATABASE_URL=postgres://… CELERY_BROKER_URL=redis://… python -m benchmarks.sessions --json

It creates (and afterwards drops) a database `<name>_sessionsbench` and starts the real
processes (`labportal.devstack`: uvicorn web, a control worker with beat, one agent
with its gateway on a simulated GPU). Each run measures, with the same client code:

- portal: from `POST /api/sessions/` to the first output of `print(6 * 7)` in a new
  kernel, through the portal's proxy (the member's session cookie; polls every 0.1 s
  while the proxy answers 503 or the job is not yet running);
- by hand: `sessions.launch`'s Jupyter command started directly on a free port, to
  the same point, talking to it directly with its token.

Both print the median of `--runs` runs, and the ratio. In the first run the same client
then times `--round-trips` GETs of the server's `/api/status` and kernel_info round trips
on a kernel's WebSocket, through the portal (web tier and gateway) and directly to the
by-hand server: p50/p95 of each and what the portal's path adds at p95.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

PASSWORD = "bench-password-1"


async def first_output(base: str, headers: dict[str, str], deadline: float) -> None:
    """Start a kernel at ``base`` (a Jupyter server's base URL), run a cell, await its output."""
    import aiohttp

    async with aiohttp.ClientSession(headers=headers) as http:
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no kernel at {base}")
            try:
                async with http.post(f"{base}api/kernels", json={"name": "python3"}) as answer:
                    if answer.status == 201:
                        kernel = (await answer.json())["id"]
                        break
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.1)
        ws_url = base.replace("http://", "ws://", 1) + f"api/kernels/{kernel}/channels"
        async with http.ws_connect(ws_url) as ws:
            msg_id = uuid.uuid4().hex
            await ws.send_json(
                {
                    "header": {
                        "msg_id": msg_id,
                        "msg_type": "execute_request",
                        "username": "bench",
                        "session": uuid.uuid4().hex,
                        "version": "5.3",
                    },
                    "parent_header": {},
                    "metadata": {},
                    "content": {"code": "print(6 * 7)", "silent": False},
                    "channel": "shell",
                }
            )
            async for frame in ws:
                if time.monotonic() > deadline:
                    raise TimeoutError("the kernel did not answer")
                message = json.loads(frame.data)
                if (
                    message.get("msg_type") == "stream"
                    and message.get("parent_header", {}).get("msg_id") == msg_id
                ):
                    assert message["content"]["text"].strip() == "42", message
                    return
    raise RuntimeError("the kernel's channel closed")


async def round_trips(base: str, headers: dict[str, str], n: int) -> dict[str, list[float]]:
    """``n`` GETs of the server's /api/status and ``n`` kernel_info round trips on a new
    kernel's WebSocket, each timed in seconds: the same client for the portal's path
    (web tier, gateway) and for a direct connection to a server."""
    import aiohttp

    http_s: list[float] = []
    ws_s: list[float] = []
    async with aiohttp.ClientSession(headers=headers) as http:
        for _ in range(n):
            started = time.perf_counter()
            async with http.get(f"{base}api/status") as answer:
                await answer.read()
                assert answer.status == 200, answer.status
            http_s.append(time.perf_counter() - started)
        async with http.post(f"{base}api/kernels", json={"name": "python3"}) as answer:
            kernel = (await answer.json())["id"]
        ws_url = base.replace("http://", "ws://", 1) + f"api/kernels/{kernel}/channels"
        async with http.ws_connect(ws_url) as ws:
            session = uuid.uuid4().hex
            for _ in range(n):
                msg_id = uuid.uuid4().hex
                started = time.perf_counter()
                await ws.send_json(
                    {
                        "header": {
                            "msg_id": msg_id,
                            "msg_type": "kernel_info_request",
                            "username": "bench",
                            "session": session,
                            "version": "5.3",
                        },
                        "parent_header": {},
                        "metadata": {},
                        "content": {},
                        "channel": "shell",
                    }
                )
                async for frame in ws:
                    message = json.loads(frame.data)
                    if (
                        message.get("msg_type") == "kernel_info_reply"
                        and message.get("parent_header", {}).get("msg_id") == msg_id
                    ):
                        break
                ws_s.append(time.perf_counter() - started)
        await http.delete(f"{base}api/kernels/{kernel}")
    return {"http": http_s, "ws": ws_s}


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return (
        round(1000 * statistics.median(ordered), 2),
        round(1000 * ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--round-trips", type=int, default=300, help="requests and WebSocket round trips timed"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from benchmarks.portal import (
        bench_database_url,
        production_settings_environment,
        recreate_database,
    )

    source = os.environ.get("DATABASE_URL", "")
    broker = os.environ.get("CELERY_BROKER_URL", "")
    if not source.startswith("postgres") or not broker.startswith("redis"):
        print("benchmarks.sessions needs DATABASE_URL=postgres://… and CELERY_BROKER_URL=redis://…")
        return 2
    bench_url, admin_url, name = bench_database_url(source, "sessionsbench")
    recreate_database(admin_url, name)
    var_dir = production_settings_environment(
        "sessionsbench",
        DATABASE_URL=bench_url,
        ALLOWED_HOSTS="127.0.0.1,localhost",
        # Demo-like: simulated GPUs and the local-process runtime, on purpose.
        LABPORTAL_ALLOW_SIMULATION="true",
    )
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from labportal.devstack import Stack

    stack = Stack(env={**os.environ, "PYTHONUNBUFFERED": "1"}, log_dir=Path(var_dir) / "logs")
    try:
        call_command("migrate", verbosity=0)
        results = _measure(args, stack, Path(var_dir))
    finally:
        stack.stop()
        connection.close()
        recreate_database(admin_url, name, drop_only=True)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"start session -> usable notebook, median of {results['runs']} runs")
        print(f"  Jupyter started by hand          {results['by_hand_s']:>6.2f} s")
        print(f"  through the portal (API, proxy)  {results['portal_s']:>6.2f} s")
        print(f"  ratio                            {results['ratio']:>6.2f}x  (goal: under 10 s)")
        print(
            f"the portal's path (web tier + gateway) against a direct connection to the same "
            f"server, {args.round_trips} each (ms)"
        )
        print("                         direct p50/p95   portal p50/p95   added p95")
        for kind, label in (("http", "GET api/status"), ("ws", "WebSocket round trip")):
            row = results["proxy"][kind]
            print(
                f"  {label:<22} {row['direct_p50_ms']:>7.2f} / {row['direct_p95_ms']:<7.2f}"
                f"{row['portal_p50_ms']:>7.2f} / {row['portal_p95_ms']:<7.2f}"
                f"{row['added_p95_ms']:>9.2f}  (goal: under 5)"
            )
    return 0


def _measure(args: argparse.Namespace, stack: Any, var_dir: Path) -> dict[str, Any]:
    import requests

    from accounts.models import Category, PersonalAccessToken, User
    from accounts.services import credits_monthly_grant
    from cluster.models import Node, NodeToken
    from jobqueue.models import ContainerImage, Job
    from labportal.devstack import free_port, wait_for_port
    from sessions.launch import JUPYTER_COMMAND, session_token

    category = Category.objects.create(name="bench", fairshare_weight=10, max_concurrent_gpus=8)
    member = User.objects.create_user("bench", "bench@lab.example", PASSWORD, category=category)
    member.ensure_unix_ids()
    credits_monthly_grant()
    ContainerImage.objects.create(reference="labportal/demo-local")
    _t, secret = NodeToken.issue(node_name="bench01")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    stack.web(port)
    stack.control_worker(var_dir / "beat-schedule")
    stack.agent(
        name="bench01",
        token=secret,
        broker=os.environ["CELERY_BROKER_URL"],
        runtime="local",
        gpus=1,
        state_dir=var_dir / "agent",
        gateway=f"127.0.0.1:{free_port()}",
    )
    deadline = time.monotonic() + 120
    while not Node.objects.filter(name="bench01", state=Node.State.UP).exclude(gateway_url=""):
        stack.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError("the agent did not register")
        time.sleep(0.5)
    wait_for_port(port)
    _pat, pat = PersonalAccessToken.issue(user=member, name="bench")
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {pat}"
    cookie = signed_in_cookie(member)

    portal: list[float] = []
    by_hand: list[float] = []
    for run in range(args.runs):
        started = time.monotonic()
        answer = api.post(
            f"{base}/api/sessions/",
            json={"kind": "jupyter", "image": "labportal/demo-local", "queue": "debug"},
            timeout=30,
        )
        assert answer.status_code == 201, answer.text
        job_id = int(answer.json()["job"]["id"])
        headers = {"Cookie": cookie, "Origin": base}
        try:
            asyncio.run(first_output(f"{base}/sessions/{job_id}/", headers, started + 120))
        except TimeoutError:
            job = Job.objects.get(pk=job_id)
            raise TimeoutError(
                f"session {job_id}: {job.state} {job.pending_reason_text} {job.end_reason}"
            ) from None
        portal.append(time.monotonic() - started)
        if run == 0:
            through = asyncio.run(
                round_trips(f"{base}/sessions/{job_id}/", headers, args.round_trips)
            )
        api.post(f"{base}/api/jobs/{job_id}/cancel/", timeout=30)
        deadline = time.monotonic() + 60
        while not Job.objects.get(pk=job_id).is_final and time.monotonic() < deadline:
            time.sleep(0.2)

        # The same server by hand: same command, same interpreter, same machine.
        fake_id = 900_000 + run
        token = session_token(job_id=fake_id, attempt=1)
        hand_port = free_port()
        home = Path(tempfile.mkdtemp(prefix="sessionsbench-hand-"))
        env = {
            "PATH": _agent_path(),
            "HOME": str(home),
            "TMPDIR": str(home),
            "LABPORTAL_JOB_ID": str(fake_id),
            "LABPORTAL_SESSION_HOST": "127.0.0.1",
            "LABPORTAL_SESSION_PORT": str(hand_port),
            "LABPORTAL_SESSION_TOKEN": token,
        }
        # As the agent runs it: as root, dropped to the member's uid (Jupyter refuses root).
        as_member: dict[str, Any] = {}
        if os.geteuid() == 0:
            uid, gid = int(member.unix_uid or 0), int(member.unix_gid or 0)
            os.chown(home, uid, gid)
            as_member = {"user": uid, "group": gid, "extra_groups": []}
        started = time.monotonic()
        server = subprocess.Popen(
            ["/bin/sh", "-c", JUPYTER_COMMAND],
            env=env,
            cwd=home,
            **as_member,
            stdout=(home / "server.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            asyncio.run(
                first_output(
                    f"http://127.0.0.1:{hand_port}/sessions/{fake_id}/",
                    {"Authorization": f"token {token}"},
                    started + 120,
                )
            )
            by_hand.append(time.monotonic() - started)
            if run == 0:
                direct = asyncio.run(
                    round_trips(
                        f"http://127.0.0.1:{hand_port}/sessions/{fake_id}/",
                        {"Authorization": f"token {token}"},
                        args.round_trips,
                    )
                )
        except TimeoutError:
            print((home / "server.log").read_text(errors="replace")[-2000:], file=sys.stderr)
            raise
        finally:
            server.terminate()
            server.wait(timeout=30)
    portal_s = statistics.median(portal)
    hand_s = statistics.median(by_hand)
    overhead = {}
    for kind in ("http", "ws"):
        (p50, p95), (d50, d95) = _percentiles(through[kind]), _percentiles(direct[kind])
        overhead[kind] = {
            "portal_p50_ms": p50,
            "portal_p95_ms": p95,
            "direct_p50_ms": d50,
            "direct_p95_ms": d95,
            "added_p95_ms": round(p95 - d95, 2),
        }
    return {
        "proxy": overhead,
        "runs": args.runs,
        "portal_s": round(portal_s, 2),
        "by_hand_s": round(hand_s, 2),
        "ratio": round(portal_s / hand_s, 2),
        "portal_runs_s": [round(v, 2) for v in portal],
        "by_hand_runs_s": [round(v, 2) for v in by_hand],
    }


def signed_in_cookie(user: Any) -> str:
    """The member's portal session, as a browser holds it after logging in (production's
    cookies are Secure, which a client on http:// would not send)."""
    from importlib import import_module

    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY

    store = import_module(settings.SESSION_ENGINE).SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.save()
    return f"{settings.SESSION_COOKIE_NAME}={store.session_key}"


def _agent_path() -> str:
    from labportal.devstack import BIN

    return os.pathsep.join([str(BIN), os.environ.get("PATH", "/usr/bin:/bin")])


if __name__ == "__main__":
    sys.exit(main())

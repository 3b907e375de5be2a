"""Commands from the portal are signed; the agent refuses unsigned, forged, expired and replayed ones.

The forged message here is the one a hardening probe pushed onto a node's queue:
a start for a job the portal never made, as uid 1, mounting the host's /etc.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from kombu import Connection

from agent import tasks
from agent.gpu import SimulatedBackend
from agent.main import broker_transport_options
from agent.node import NodeAgent
from agent.reporter import ControlReporter
from protocol.signing import CommandVerifier, NonceLedger, SignatureRefused, sign_command
from tests.agent.support import FakeRuntime, RecordingApp, drain_queue, job_spec, signed

TOKEN = "lpn_node-token-for-signing-tests"
FORGED = job_spec(
    990001,
    uid=1,
    gid=1,
    command=["sh", "-c", "ls /host"],
    mounts=[{"source": "/etc", "target": "/host", "read_only": True}],
)


def verifier(clock: Any = time.time, ledger: NonceLedger | None = None) -> CommandVerifier:
    return CommandVerifier(TOKEN, "gpu01", ledger, clock=clock)


def test_a_command_the_portal_signed_is_accepted_once() -> None:
    check = verifier()
    args = [job_spec(1)]
    auth = signed("agent.start_job", "gpu01", args, token=TOKEN)

    check.verify("agent.start_job", args, auth)
    with pytest.raises(SignatureRefused) as replay:
        check.verify("agent.start_job", args, auth)
    assert replay.value.reason == "replayed"


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("unsigned", "unsigned"),
        ("other_token", "bad_signature"),
        ("tampered_args", "bad_signature"),
        ("other_task", "bad_signature"),
        ("other_node", "bad_signature"),
        ("expired", "expired"),
        ("garbage", "malformed"),
    ],
)
def test_the_agent_refuses_commands_it_cannot_trust(case: str, reason: str) -> None:
    args = [job_spec(1)]
    auth: Any = signed("agent.start_job", "gpu01", args, token=TOKEN)
    task, node = "agent.start_job", "gpu01"
    if case == "unsigned":
        auth = None
    elif case == "other_token":
        auth = signed("agent.start_job", "gpu01", args, token="lpn_someone-elses-token")
        auth["sigs"] = {TOKEN[:10]: next(iter(auth["sigs"].values()))}
    elif case == "tampered_args":
        args = [FORGED]
    elif case == "other_task":
        task = "agent.stop_job"
    elif case == "other_node":
        node = "gpu02"
    elif case == "expired":
        auth = signed("agent.start_job", "gpu01", args, token=TOKEN, ttl_s=1)
    elif case == "garbage":
        auth = {"v": 1, "sigs": {TOKEN[:10]: "x"}, "ts": "now", "exp": 1, "nonce": "n"}
    check = CommandVerifier(
        TOKEN, node, clock=lambda: time.time() + (5 if case == "expired" else 0)
    )

    with pytest.raises(SignatureRefused) as refused:
        check.verify(task, args, auth)
    assert refused.value.reason == reason


def test_a_command_signed_in_the_future_beyond_the_clock_skew_is_refused() -> None:
    args = [job_spec(1)]
    auth = signed("agent.start_job", "gpu01", args, token=TOKEN)
    check = verifier(clock=lambda: time.time() - 3600)

    with pytest.raises(SignatureRefused) as refused:
        check.verify("agent.start_job", args, auth)
    assert refused.value.reason == "clock_skew"


def test_replay_protection_survives_an_agent_restart(tmp_path: Path) -> None:
    args = [job_spec(1)]
    auth = signed("agent.start_job", "gpu01", args, token=TOKEN)
    verifier(ledger=NonceLedger(tmp_path / "nonces.json")).verify("agent.start_job", args, auth)

    restarted = verifier(ledger=NonceLedger(tmp_path / "nonces.json"))
    with pytest.raises(SignatureRefused) as refused:
        restarted.verify("agent.start_job", args, auth)
    assert refused.value.reason == "replayed"


def test_a_node_with_two_active_tokens_checks_the_signature_of_its_own() -> None:
    args = [job_spec(1)]
    from protocol.signing import key_from_token, token_kid

    keys = {token_kid(t): key_from_token(t) for t in (TOKEN, "lpn_the-other-token-of-gpu01")}
    auth = sign_command(keys, task="agent.start_job", node="gpu01", args=args)

    verifier().verify("agent.start_job", args, auth)
    CommandVerifier("lpn_the-other-token-of-gpu01", "gpu01").verify("agent.start_job", args, auth)


def test_a_forged_start_runs_nothing_and_is_reported_to_the_portal() -> None:
    recorder, runtime = RecordingApp(), FakeRuntime()
    node_agent = NodeAgent(
        node="gpu01",
        backend=SimulatedBackend(1, node_name="gpu01"),
        runtime=runtime,
        reporter=ControlReporter(recorder, "gpu01", TOKEN),
        verifier=verifier(),
        allowed_mount_roots=["/etc"],  # even where the root allows it, unsigned is refused
    )
    tasks.set_node_agent(node_agent)
    try:
        result = tasks.start_job.apply(args=[FORGED]).result
        stop = tasks.stop_job.apply(args=[1, 0, "x"], kwargs={"auth": {"v": 1}}).result
    finally:
        tasks.set_node_agent(None)

    assert result["ok"] is False and result["refused"] == "unsigned"
    assert stop["refused"] == "malformed"
    assert runtime.jobs == {}
    refusals = recorder.args_of("control.command_refused")
    assert [r[2:4] for r in refusals] == [
        ["agent.start_job", "unsigned"],
        ["agent.stop_job", "malformed"],
    ]


def test_an_agent_without_a_key_refuses_every_command() -> None:
    recorder, runtime = RecordingApp(), FakeRuntime()
    node_agent = NodeAgent(
        node="gpu01",
        backend=SimulatedBackend(1, node_name="gpu01"),
        runtime=runtime,
        reporter=ControlReporter(recorder, "gpu01", TOKEN),
    )
    args = [job_spec(1)]
    refusal = node_agent.refuse_unless_signed(
        "agent.start_job", args, signed("agent.start_job", "gpu01", args, token=TOKEN)
    )
    assert refusal is not None and refusal["refused"] == "unsigned"


@pytest.mark.e2e
def test_a_real_agent_refuses_forged_expired_and_replayed_commands_on_its_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    broker_dir = tmp_path / "broker"
    broker_dir.mkdir()
    url = f"filesystem://{broker_dir}"
    transport = broker_transport_options(url)
    marker = tmp_path / "ran"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LABPORTAL_NODE_NAME": "sig",
        "LABPORTAL_BROKER_URL": url,
        "LABPORTAL_NODE_TOKEN": TOKEN,
        "LABPORTAL_RUNTIME": "local",
        "LABPORTAL_ALLOW_LOCAL_RUNTIME": "1",
        "LABPORTAL_GPU_BACKEND": "simulated",
        "LABPORTAL_SIM_GPUS": "1",
        "LABPORTAL_HEARTBEAT_INTERVAL": "0.3",
        "LABPORTAL_SAMPLE_INTERVAL": "5",
        "LABPORTAL_AGENT_STATE_DIR": str(tmp_path / "state"),
        "LABPORTAL_ALLOWED_MOUNT_ROOTS": "/etc",
    }
    portal = Celery("portal-test", broker="filesystem://")
    portal.conf.broker_transport_options = transport

    def send(args: list[Any], auth: Any, task: str = "agent.start_job") -> None:
        kwargs = {} if auth is None else {"auth": auth}
        portal.send_task(task, args=args, kwargs=kwargs, queue="node.sig")

    forged = dict(FORGED, command=["sh", "-c", f"touch {marker}"])
    send([forged], None)  # unsigned
    send([forged], signed("agent.start_job", "sig", [forged], token="lpn_not-this-nodes"))
    send([forged], signed("agent.start_job", "sig", [forged], token=TOKEN, ttl_s=-1))
    good = job_spec(7, command=["sh", "-c", "sleep 0.2"])
    good_auth = signed("agent.start_job", "sig", [good], token=TOKEN)
    send([good], good_auth)
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.main"],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    seen: list[tuple[str, list[Any]]] = []
    try:
        with Connection("filesystem://", transport_options=transport) as conn:

            def wait_for(count: int, task: str, pred: Any = lambda a: True) -> list[list[Any]]:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    found = [a for n, a in seen if n == task and pred(a)]
                    if len(found) >= count:
                        return found
                    seen.extend(drain_queue(conn, "control"))
                    assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                    time.sleep(0.1)
                raise AssertionError(f"not {count} × {task} in 30s; saw {[n for n, _ in seen]}")

            wait_for(1, "control.job_event", lambda a: a[2]["kind"] == "exited")
            # The same signed message again (a replay captured off the broker).
            send([good], good_auth)
            refusals = wait_for(4, "control.command_refused")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()

    # The agent runs several tasks at once, so the first three may be refused in any order.
    assert sorted(r[3] for r in refusals) == ["bad_signature", "expired", "replayed", "unsigned"]
    assert not marker.exists()
    events = [a[2] for n, a in seen if n == "control.job_event"]
    assert [e["job_id"] for e in events] == [7, 7]  # started and exited, once
    assert all(TOKEN not in json.dumps(a) for _, a in seen)

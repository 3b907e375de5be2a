"""Outages of the database and the broker, and replays, across real processes (issue 25).

Each test starts a private PostgreSQL and a private Redis (never the machine's own), a
control worker with beat and a node agent on simulated GPUs running its job as a local
process, then stops and starts those servers under them. What the portal recorded is
read from the private database. Every wait is bounded; nothing is asserted on timing.

Reproduce one with, for example::

    PYTHONPATH=$PWD .venv/bin/python -m pytest tests/reliability/test_outages.py -k database
    LABPORTAL_OUTAGE_S=75 ...   # a longer outage than the default 30 s
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from labportal.devstack import Stack
from tests.reliability.private_services import (
    PrivatePostgres,
    PrivateRedis,
    require_binaries,
    wait_port_closed,
)

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

REPO = Path(__file__).resolve().parents[2]
OUTAGE_S = float(os.environ.get("LABPORTAL_OUTAGE_S", "30"))


@dataclass
class Lab:
    """The private servers, the real processes, and ways to look at what they did."""

    pg: PrivatePostgres
    private_redis: PrivateRedis | None  # None on the filesystem broker
    stack: Stack
    node: str
    token: str
    shared: Path  # a directory the job (another uid) can read: the test's switch lives here
    state_dir: Path  # the agent's
    broker_url: str  # the agent's: the private Redis, or filesystem://<the portal's folder>

    @property
    def redis(self) -> PrivateRedis:
        assert self.private_redis is not None, "this lab runs on the filesystem broker"
        return self.private_redis

    def lab(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "tests.reliability.outage_lab", *args],
            env=self.stack.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip().splitlines()[-1]

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        import psycopg

        url = f"host=127.0.0.1 port={self.pg.port} user=postgres dbname=labportal"
        with psycopg.connect(url, connect_timeout=5) as conn:
            return list(conn.execute(query, params).fetchall())

    def job_state(self, job_id: int) -> str:
        return str(self.sql("SELECT state FROM jobqueue_job WHERE id = %s", job_id)[0][0])

    def wait(self, condition: Callable[[], bool], *, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if condition():
                return
            self.stack.check_alive()
            time.sleep(0.5)
        logs = "\n".join(f"--- {name}\n{self.stack.tail(name, 60)}" for name in self.stack.procs)
        pytest.fail(f"timed out after {timeout_s} s waiting for {what}\n{logs}")

    def agent_log(self) -> str:
        path = self.stack.log_dir / f"agent-{self.node}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start_agent(self, **env: str) -> None:
        self.stack.agent(
            name=self.node,
            token=self.token,
            broker=self.broker_url,
            runtime="local",
            gpus=1,
            state_dir=self.state_dir,
            extra_env=env,
        )
        self.wait(
            lambda: (
                self.sql("SELECT state FROM cluster_node WHERE name = %s", self.node) == [("up",)]
            ),
            timeout_s=90,
            what="the agent to register",
        )

    def run_job_until_switched(self) -> tuple[int, Path]:
        """A running job that exits 0 once the returned file exists."""
        switch = self.shared / f"exit-{uuid.uuid4().hex[:6]}"
        job_id = int(self.lab("submit", f"while [ ! -e {switch} ]; do sleep 0.1; done; echo done"))
        self.wait(lambda: self.job_state(job_id) == "running", timeout_s=60, what="the job to run")
        return job_id, switch

    def wait_for_exit_on_the_node(self, job_id: int) -> None:
        self.wait(
            lambda: f"job {job_id} exited with 0" in self.agent_log(),
            timeout_s=30,
            what="the job to exit on its node",
        )


@pytest.fixture
def start_lab(tmp_path: Path) -> Iterator[Callable[..., Lab]]:
    """Start the private servers and a control worker with these settings; stop all after.

    ``broker="filesystem"`` runs the demo's serverless broker instead of the private
    Redis: kombu's filesystem transport on a folder under the lab's var/, which the
    agent names too (as ``rundemo`` does), and the demo's file cache.
    """
    cleanups: list[Callable[[], None]] = []

    def start(*, broker: Literal["redis", "filesystem"] = "redis", **control_env: str) -> Lab:
        require_binaries(redis=broker == "redis")
        var_dir = tmp_path / "var"
        pg = PrivatePostgres()
        cleanups.append(pg.close)
        pg.start()
        pg.create_database()
        redis: PrivateRedis | None = None
        if broker == "redis":
            redis = PrivateRedis()
            cleanups.append(redis.close)
            redis.start()
            control_broker = agent_broker = redis.url
        else:
            # The portal's settings put the queues in var/broker/out (labportal/settings.py).
            control_broker, agent_broker = (
                "filesystem://",
                f"filesystem://{var_dir / 'broker' / 'out'}",
            )
        env = {
            **os.environ,
            "DATABASE_URL": pg.url,
            "CELERY_BROKER_URL": control_broker,
            "LABPORTAL_VAR_DIR": str(var_dir),
            "LABPORTAL_ALLOW_SIMULATION": "true",
            "PYTHONUNBUFFERED": "1",
            **control_env,
        }
        for leaked in ("DJANGO_SETTINGS_MODULE", "CACHE_URL"):
            # The cache is the broker's Redis, as in production; a file cache under var/
            # on the filesystem broker, as in the demo.
            env.pop(leaked, None)
        stack = Stack(env=env, log_dir=tmp_path / "logs")
        cleanups.insert(0, stack.stop)
        # The job runs as a member's uid, which cannot enter pytest's own (0700) directories.
        shared = Path(tempfile.mkdtemp(prefix="labportal-outage-"))
        shared.chmod(0o755)
        cleanups.append(lambda: shutil.rmtree(shared, ignore_errors=True))
        lab = Lab(
            pg=pg,
            private_redis=redis,
            stack=stack,
            node=f"out-{uuid.uuid4().hex[:6]}",
            token="",
            shared=shared,
            state_dir=tmp_path / "agent",
            broker_url=agent_broker,
        )
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "-v", "0"],
            env=env,
            cwd=REPO,
            check=True,
            timeout=300,
        )
        lab.token = lab.lab("setup", lab.node)
        stack.control_worker(tmp_path / "beat-schedule")
        return lab

    yield start
    for cleanup in cleanups:
        cleanup()


def test_a_job_that_ends_while_the_database_is_stopped_completes_once_it_is_back(
    start_lab: Callable[..., Lab],
) -> None:
    """Longer than the old retry budget (5 retries, about 20 s), which dropped the event;
    and the old retry after the database came back was refused as a replay."""
    lab = start_lab(LABPORTAL_LIVENESS_CHECK_S="2")
    lab.start_agent()
    job_id, switch = lab.run_job_until_switched()

    lab.pg.stop()
    wait_port_closed(lab.pg.port)
    stopped_at = time.monotonic()
    switch.touch()
    lab.wait_for_exit_on_the_node(job_id)
    time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - stopped_at)))  # hold the outage
    lab.pg.start()

    lab.wait(
        lambda: lab.job_state(job_id) not in ("running", "dispatched"),
        timeout_s=120,
        what="the job to end in the portal",
    )
    report = json.loads(lab.lab("report", str(job_id)))
    assert (report["state"], report["exit_code"]) == ("completed", 0), report
    assert "lost" not in report["events"] and report["refunds"] == 0, report
    assert not [r for r in report["rejected"] if r["detail"].startswith("replayed")], report
    assert not [r for r in report["rejected"] if r["message"] == "job_event"], report


def test_a_job_that_exits_as_the_broker_stops_is_not_lost_when_it_comes_back_late(
    start_lab: Callable[..., Lab],
) -> None:
    """The broker (and with it the cache) is away longer than the node's silence allows
    (down after 10 s, lost at once): the old liveness check counted the outage as the
    node's silence and declared its finished job lost."""
    lab = start_lab(
        LABPORTAL_LIVENESS_CHECK_S="2",
        LABPORTAL_NODE_DOWN_AFTER_S="10",
        LABPORTAL_NODE_LOST_GRACE_S="0",
    )
    lab.start_agent(LABPORTAL_HEARTBEAT_INTERVAL="5")
    job_id, switch = lab.run_job_until_switched()

    lab.redis.stop()
    wait_port_closed(lab.redis.port)
    stopped_at = time.monotonic()
    switch.touch()
    lab.wait_for_exit_on_the_node(job_id)
    time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - stopped_at)))  # hold the outage
    assert lab.job_state(job_id) == "running"  # nothing could reach the portal meanwhile
    lab.redis.start()

    lab.wait(
        lambda: lab.job_state(job_id) not in ("running", "dispatched"),
        timeout_s=120,
        what="the job to end in the portal",
    )
    report = json.loads(lab.lab("report", str(job_id)))
    assert (report["state"], report["exit_code"]) == ("completed", 0), report
    assert "lost" not in report["events"] and report["refunds"] == 0, report


def test_a_captured_heartbeat_replayed_after_the_broker_is_wiped_is_refused(
    start_lab: Callable[..., Lab],
) -> None:
    """Whoever can write to the broker's Redis can delete what is kept there; the replay
    state is not there. Also refused: a report signed in 1970, and samples dated 1970."""
    from agent.celery_app import create_app
    from agent.reporter import ControlReporter

    lab = start_lab(LABPORTAL_LIVENESS_CHECK_S="2")
    lab.start_agent()
    broker = create_app(lab.redis.url)
    captured: list[tuple[str, list[Any]]] = []

    class Capturing:
        def send_task(self, name: str, args: Any = None, **options: Any) -> Any:
            captured.append((name, list(args)))
            return broker.send_task(name, args=args, **options)

    reporter = ControlReporter(Capturing(), lab.node, lab.token)
    lab.stack.procs[f"agent-{lab.node}"].kill()  # the node dies; its heartbeats stop
    lab.stack.procs.pop(f"agent-{lab.node}").wait(timeout=30)

    def last_heartbeat() -> Any:
        return lab.sql("SELECT last_heartbeat FROM cluster_node WHERE name = %s", lab.node)[0][0]

    def refused(message: str, detail: str) -> bool:
        """Whether the last refusal of `message` said `detail` (one row counts each reason)."""
        query = "SELECT 1 FROM cluster_rejectedmessage WHERE message = %s AND last_detail LIKE %s"
        return bool(lab.sql(query, message, detail))

    def redis(*command: str) -> str:
        argv = ["redis-cli", "-p", str(lab.redis.port), *command]
        return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30).stdout

    def settled() -> bool:
        """No heartbeat of the dead agent is still on its way: an empty queue is not enough, a
        worker may have taken the last one and not yet written it."""
        seen = last_heartbeat()
        time.sleep(1.0)
        return last_heartbeat() == seen

    lab.wait(lambda: redis("LLEN", "control").strip() == "0", timeout_s=30, what="a quiet queue")
    lab.wait(settled, timeout_s=30, what="the dead agent's last heartbeat written")
    dead_since = last_heartbeat()
    # A heartbeat of the node, signed with its token, as anyone reading the broker sees one.
    assert reporter.heartbeat({"ts": time.time(), "running_job_ids": []})
    lab.wait(lambda: last_heartbeat() != dead_since, timeout_s=30, what="the heartbeat")
    before = last_heartbeat()

    redis("FLUSHALL")  # the broker's Redis, which is the portal's cache too, wiped
    name, args = captured[0]
    broker.send_task(name, args=args, queue="control")
    lab.wait(lambda: refused("node_heartbeat", "replayed%"), timeout_s=60, what="a refusal")
    assert last_heartbeat() == before

    from protocol.signing import key_from_token, sign, token_kid

    info = {"ts": 1.0, "running_job_ids": []}
    old = sign(
        key_from_token(lab.token),
        kid=token_kid(lab.token),
        task=name,
        node=lab.node,
        args=[info],
        ttl_s=3600,
        now=1.0,
    )
    broker.send_task(name, args=[lab.node, old, info], queue="control")
    lab.wait(lambda: refused("node_heartbeat", "expired%"), timeout_s=60, what="a refusal")
    assert last_heartbeat() == before

    gpu = lab.sql("SELECT uuid FROM cluster_gpu ORDER BY id LIMIT 1")[0][0]
    assert reporter.samples([{"gpu_uuid": gpu, "ts": 1.0, "util_pct": 99.0}])
    lab.wait(lambda: refused("samples_ingest", "%stale%"), timeout_s=60, what="a refusal")
    assert lab.sql("SELECT count(*) FROM telemetry_gpusample WHERE ts < '2000-01-01'") == [(0,)]


def test_the_web_tier_answers_at_once_after_the_database_restarts(
    start_lab: Callable[..., Lab],
) -> None:
    """The web tier's pool (labportal/settings.py, "Database") holds connections that a
    restart breaks: each is checked before use and replaced, so no request after the
    restart fails on one (without the check, each broken one cost a request its 503)."""
    import concurrent.futures

    import requests

    from labportal.devstack import free_port, wait_for_port

    lab = start_lab()
    port = free_port()
    lab.stack.web(port, workers=1)
    wait_for_port(port, timeout_s=60)
    url = f"http://127.0.0.1:{port}/healthz"

    def hit(_: int) -> int:
        return requests.get(url, timeout=30).status_code

    with concurrent.futures.ThreadPoolExecutor(8) as clients:  # fill the pool
        assert set(clients.map(hit, range(80))) == {200}
    lab.pg.stop()
    wait_port_closed(lab.pg.port)
    assert hit(0) == 503  # down is down: a 503 with Retry-After
    lab.pg.start()
    wait_for_port(lab.pg.port, timeout_s=60)
    assert [hit(i) for i in range(20)] == [200] * 20

"""Reliability: what the probe did, with a real agent and the portal's real handlers.

A real `NodeAgent` (simulated GPUs, the local-process runtime, so real processes)
talks to the portal through the same control tasks the control worker runs; only
the broker in between is left out. Each test is a fault the probe found:

- a job whose output holds NUL bytes must end normally (PostgreSQL refused it);
- a `start_job` the node never receives must not hold its GPUs for ever;
- an agent whose clock is a year off must not charge a year of credits.

Run on PostgreSQL too (the second pass of CI).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.conf import settings
from django.db.models import Sum
from django.utils import timezone

from accounts.models import LedgerEntry
from agent.gpu.simulated import SimulatedBackend
from agent.node import NodeAgent
from agent.reporter import ControlReporter
from agent.runtime import JobSpec, JobStatus, StartOutcome
from agent.runtime.local import LocalProcessRuntime
from cluster.models import NodeToken, RejectedMessage
from joblogs.selectors import latest_log, log_bytes
from jobqueue.models import Job
from scheduling.passes import scheduling_pass
from tests.agent.support import wait_until
from tests.jobqueue.test_submit import submit

pytestmark = pytest.mark.django_db

NODE = "sim01"
GRACE = timedelta(seconds=settings.LABPORTAL_JOB_UNREPORTED_GRACE_S)
A_YEAR = 365 * 86400


class PortalBridge:
    """Stands in for the broker: runs the portal's control task, as its worker would.

    A task sent from the test's thread runs at once. One sent from another thread (the
    agent streams each job's output from a thread of its own) waits for ``deliver``,
    which the test's thread calls: run there, it sees this test's transaction, as the
    portal's worker sees committed rows; run in the sender's thread, it would reach the
    database on a connection of its own, outside the transaction (on PostgreSQL the node
    would be unknown to it, and what it wrote would outlive the test).
    """

    def __init__(self) -> None:
        self.results: list[tuple[str, str]] = []
        self._owner = threading.get_ident()
        self._waiting: queue.SimpleQueue[tuple[str, list[Any]]] = queue.SimpleQueue()

    def send_task(self, name: str, args: Any = None, **options: Any) -> None:
        if threading.get_ident() != self._owner:
            self._waiting.put((name, list(args or [])))
            return
        self._run(name, list(args or []))

    def deliver(self) -> None:
        """Run the tasks other threads sent, in the order they were sent."""
        while True:
            try:
                name, args = self._waiting.get_nowait()
            except queue.Empty:
                return
            self._run(name, args)

    def _run(self, name: str, args: list[Any]) -> None:
        import cluster.tasks  # noqa: F401  (registers the control tasks)
        import joblogs.tasks  # noqa: F401
        import scheduling.tasks  # noqa: F401
        import telemetry.tasks  # noqa: F401
        from labportal.celery import app

        self.results.append((name, app.tasks[name](*args)))


class YearBehindRuntime(LocalProcessRuntime):
    """A node whose clock is a year behind: the times it reads for its jobs are a year old."""

    def _shifted(self, status: JobStatus) -> JobStatus:
        def back(ts: float | None) -> float | None:
            return None if ts is None else ts - A_YEAR

        return replace(
            status, started_at=back(status.started_at), finished_at=back(status.finished_at)
        )

    def start(self, spec: JobSpec) -> StartOutcome:
        outcome = super().start(spec)
        return replace(outcome, status=self._shifted(outcome.status))

    def list_jobs(self) -> list[JobStatus]:
        return [self._shifted(status) for status in super().list_jobs()]


@pytest.fixture
def make_agent(
    tmp_path: Path, queues: Any, image: Any, settings: Any
) -> Callable[..., tuple[NodeAgent, PortalBridge]]:
    settings.LABPORTAL_ALLOW_SIMULATION = True
    _token, secret = NodeToken.issue(node_name=NODE)

    def make(
        runtime: type[LocalProcessRuntime] = LocalProcessRuntime,
    ) -> tuple[NodeAgent, PortalBridge]:
        bridge = PortalBridge()

        class WatchedExits(runtime):  # type: ignore[misc, valid-type]
            """Exits are found by the agent's watch (run_until_reported) in the test's
            thread: the runtime's waiter thread would reach the database on a connection of
            its own, outside this test's transaction. The at-once path is tested in
            tests/agent."""

            def on_exit(self, callback: Callable[[int], None]) -> None:
                return None

        agent = NodeAgent(
            node=NODE,
            backend=SimulatedBackend(2, node_name=NODE),
            runtime=WatchedExits(tmp_path, enabled=True),
            reporter=ControlReporter(bridge, NODE, secret),
        )
        agent.register()
        assert bridge.results == [("control.node_register", "ok")]
        return agent, bridge

    return make


def dispatch(owner: Any, script: str, on_commit: Any, sent_tasks: Any) -> tuple[Job, dict]:
    job = submit(owner, command=["sh", "-c", script])
    with on_commit(execute=True):
        scheduling_pass()
    job.refresh_from_db()
    assert job.state == Job.State.DISPATCHED and job.node is not None
    [(_name, [spec], queue)] = sent_tasks.named("agent.start_job")
    assert queue == f"node.{NODE}"
    return job, spec


def run_until_reported(agent: NodeAgent, bridge: PortalBridge, job: Job, on_commit: Any) -> None:
    def ended() -> bool:
        with on_commit(execute=True):
            bridge.deliver()
            agent.watch_once()
            bridge.deliver()
        return job.pk not in agent.running_job_ids()

    wait_until(ended, timeout_s=20)


def net_charge(job: Job) -> Decimal:
    total = LedgerEntry.objects.filter(job=job).aggregate(s=Sum("amount"))["s"]
    return -(total or Decimal(0))


def test_a_job_whose_output_holds_nul_bytes_completes(
    make_agent: Any, alice: Any, django_capture_on_commit_callbacks: Any, sent_tasks: Any
) -> None:
    agent, bridge = make_agent()
    script = r"printf 'epoch 1\000\000 loss 0.5\n'; printf 'done\n'"
    job, spec = dispatch(alice, script, django_capture_on_commit_callbacks, sent_tasks)

    with django_capture_on_commit_callbacks(execute=True):
        assert agent.start_job(spec, delivery_id="d1")["ok"]
    run_until_reported(agent, bridge, job, django_capture_on_commit_callbacks)

    job.refresh_from_db()
    assert job.state == Job.State.COMPLETED and job.exit_code == 0
    assert "epoch 1\ufffd\ufffd loss 0.5\ndone\n" in job.log_tail
    assert not job.allocations.filter(active=True).exists()
    assert all(result == "ok" for _name, result in bridge.results), bridge.results
    # The whole output is kept as it was written, NUL bytes and all (a bytea column).
    log = latest_log(job)
    assert log is not None and log.complete
    assert b"".join(log_bytes(log)) == b"epoch 1\x00\x00 loss 0.5\ndone\n"
    # A restarted agent reports the same exit again: it changes nothing and fails nothing.
    with django_capture_on_commit_callbacks(execute=True):
        make_agent()[0].reconcile()
    assert not RejectedMessage.objects.exists()


def test_a_lost_start_is_sent_again_and_the_job_then_runs(
    make_agent: Any, alice: Any, django_capture_on_commit_callbacks: Any, sent_tasks: Any
) -> None:
    agent, bridge = make_agent()
    job, _lost_spec = dispatch(alice, "exit 0", django_capture_on_commit_callbacks, sent_tasks)
    # The start never reaches the agent (it was killed with the message in flight).

    ack = timedelta(seconds=settings.LABPORTAL_START_ACK_S + 1)
    with (
        django_capture_on_commit_callbacks(execute=True),
        time_machine.travel(timezone.now() + ack),
    ):
        agent.heartbeat_once()

    [_first, (_name, [resent], _queue)] = sent_tasks.named("agent.start_job")
    with django_capture_on_commit_callbacks(execute=True):
        assert agent.start_job(resent, delivery_id="d2")["ok"]
    run_until_reported(agent, bridge, job, django_capture_on_commit_callbacks)
    job.refresh_from_db()
    assert job.state == Job.State.COMPLETED
    kinds = set(job.events.values_list("kind", flat=True))
    assert {"dispatched", "start_resent", "started", "exited"} <= kinds


def test_a_lost_start_that_is_never_received_frees_the_gpus(
    make_agent: Any, alice: Any, django_capture_on_commit_callbacks: Any, sent_tasks: Any
) -> None:
    agent, bridge = make_agent()
    job, _spec = dispatch(alice, "exit 0", django_capture_on_commit_callbacks, sent_tasks)
    ack = timedelta(seconds=settings.LABPORTAL_START_ACK_S + 1)
    now = timezone.now()

    for beat in range(1, settings.LABPORTAL_START_RETRIES + 2):
        with (
            django_capture_on_commit_callbacks(execute=True),
            time_machine.travel(now + ack * beat),
        ):
            agent.heartbeat_once()

    job.refresh_from_db()
    assert job.state == Job.State.PENDING, "back in the queue, its place kept"
    assert not job.allocations.filter(active=True).exists()


def test_an_agent_clock_a_year_off_charges_nothing_for_a_year(
    make_agent: Any, alice: Any, django_capture_on_commit_callbacks: Any, sent_tasks: Any
) -> None:
    agent, bridge = make_agent(YearBehindRuntime)
    job, spec = dispatch(alice, "exit 0", django_capture_on_commit_callbacks, sent_tasks)

    with django_capture_on_commit_callbacks(execute=True):
        agent.start_job(spec, delivery_id="d1")
        agent.heartbeat_once()  # the node reports it running
    assert ("control.job_event", "refused: bad_time") in bridge.results
    job.refresh_from_db()
    assert job.state == Job.State.DISPATCHED and job.started_at is None

    # The node's heartbeats still say what happened: it ran, then it ended.
    first_seen = timezone.now()
    with django_capture_on_commit_callbacks(execute=True), time_machine.travel(first_seen + GRACE):
        agent.heartbeat_once()
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING
    run_until_reported(
        agent, bridge, job, django_capture_on_commit_callbacks
    )  # its exit is refused too
    later = timezone.now() + GRACE * 2
    for at in (later, later + GRACE + timedelta(seconds=1)):
        with django_capture_on_commit_callbacks(execute=True), time_machine.travel(at):
            agent.heartbeat_once()

    job.refresh_from_db()
    assert job.state == Job.State.LOST
    assert net_charge(job) == 0
    assert RejectedMessage.objects.get(reason="bad_time").count == 2

"""Agent reports across outages of the database, and replays that the broker cannot enable.

The cross-process versions (a real agent, control worker, PostgreSQL and Redis, stopped
and started) are in tests/reliability/test_outages.py.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine
from django.core.cache import cache
from django.db import OperationalError
from django.test import override_settings
from django.utils import timezone

from cluster.models import ControlClock, Node, ReportNonce
from cluster.tasks import RETRY_BACKOFF_MAX_S, node_heartbeat, nodes_check_liveness
from jobqueue.models import Job
from scheduling import agent_events
from scheduling.tasks import job_event
from tests.cluster.conftest import job_on
from tests.cluster.test_signed_messages import signed_report

pytestmark = pytest.mark.django_db


def an_exit(job_id: int, exit_code: int = 0) -> dict[str, Any]:
    return {
        "event_id": f"{job_id}:exited:c0ffee",
        "job_id": job_id,
        "kind": "exited",
        "ts": time.time(),
        "container_id": "c0ffee",
        "exit_code": exit_code,
        "log_tail": "done\n",
        "reason": "",
    }


@pytest.fixture
def running_job(registered_node: Any, alice: Any) -> Job:
    job: Job = job_on(registered_node[0], alice)
    return job


def job_exit_report(job: Job, secret: str, **signing: Any) -> list[Any]:
    """The arguments of `control.job_event` for the job's exit (code 0), signed by gpu01."""
    event = an_exit(job.pk)
    return ["gpu01", signed_report("control.job_event", "gpu01", [event], secret, **signing), event]


@pytest.fixture
def database_away_for(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make the next `n` job events fail as a stopped database fails them, mid-transaction."""
    real = agent_events.job_event_accept
    failures = {"left": 0, "raised": 0}

    def accept(**kwargs: Any) -> None:
        if failures["left"]:
            failures["left"] -= 1
            failures["raised"] += 1
            raise OperationalError("connection to server at 127.0.0.1 failed: Connection refused")
        real(**kwargs)

    monkeypatch.setattr(agent_events, "job_event_accept", accept)

    def away(n: int) -> dict[str, int]:
        failures["left"] = n
        return failures

    return away


def test_a_report_whose_effect_the_database_rolled_back_is_accepted_when_sent_again(
    registered_node: Any, running_job: Job, database_away_for: Any
) -> None:
    report = job_exit_report(running_job, registered_node[1])
    database_away_for(1)

    with pytest.raises(OperationalError):
        job_event(*report)  # the broker then delivers it again
    assert not ReportNonce.objects.exists()

    assert job_event(*report) == "ok"
    running_job.refresh_from_db()
    assert (running_job.state, running_job.exit_code) == (Job.State.COMPLETED, 0)
    assert job_event(*report) == "refused: bad_token"  # now it is a replay


def test_a_job_event_is_retried_through_an_outage_longer_than_twenty_retries(
    registered_node: Any, running_job: Job, database_away_for: Any
) -> None:
    failures = database_away_for(25)

    result = job_event.apply(args=job_exit_report(running_job, registered_node[1]))

    assert result.get() == "ok"
    assert failures["raised"] == 25
    running_job.refresh_from_db()
    assert (running_job.state, running_job.exit_code) == (Job.State.COMPLETED, 0)


def test_retries_back_off_to_a_cap_and_stop_only_past_the_horizon(
    registered_node: Any, running_job: Job, database_away_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    countdowns: list[float] = []
    real_retry = job_event.retry

    def retry(*args: Any, **kwargs: Any) -> Any:
        countdowns.append(kwargs["countdown"])
        return real_retry(*args, **kwargs)

    monkeypatch.setattr(job_event, "retry", retry)
    database_away_for(10)
    job_event.apply(args=job_exit_report(running_job, registered_node[1]))
    assert countdowns == [1, 2, 4, 8, 15, 15, 15, 15, 15, 15]
    assert RETRY_BACKOFF_MAX_S == 15

    # Signed longer ago than the horizon (the node-lost grace and more): no retry, and the
    # report is recorded as failed to apply, where admins see it.
    countdowns.clear()
    database_away_for(1)
    old = timezone.now().timestamp() - 400
    with override_settings(LABPORTAL_REPORT_RETRY_S=360):
        result = job_event.apply(args=job_exit_report(running_job, registered_node[1], now=old))
    assert countdowns == []
    assert result.get() == "refused: apply_failed"


def test_a_captured_heartbeat_is_refused_again_after_the_cache_is_wiped(
    registered_node: Any,
) -> None:
    """Whoever can write to the broker's Redis can wipe the cache; the nonce is not there."""
    node, secret = registered_node
    info = {"ts": time.time(), "running_job_ids": []}
    auth = signed_report("control.node_heartbeat", "gpu01", [info], secret)
    assert node_heartbeat("gpu01", auth, info) == "ok"

    cache.clear()
    Node.objects.filter(pk=node.pk).update(state=Node.State.DOWN, last_heartbeat=None)

    assert node_heartbeat("gpu01", auth, info) == "refused: bad_token"
    node.refresh_from_db()
    assert (node.state, node.last_heartbeat) == (Node.State.DOWN, None)


def test_a_report_signed_long_ago_is_refused_as_stale_though_not_yet_expired(
    registered_node: Any,
) -> None:
    _node, secret = registered_node
    info = {"ts": time.time(), "running_job_ids": []}
    two_days_ago = timezone.now().timestamp() - 2 * 86400
    auth = signed_report(
        "control.node_heartbeat", "gpu01", [info], secret, now=two_days_ago, ttl_s=3 * 86400
    )

    assert node_heartbeat("gpu01", auth, info) == "refused: bad_token"
    from cluster.models import RejectedMessage

    assert RejectedMessage.objects.get(message="node_heartbeat").last_detail.startswith("stale")


@pytest.mark.parametrize("ts", [1.0, 86400.0 * 365])
def test_a_sample_dated_1970_is_refused(registered_node: Any, ts: float) -> None:
    from telemetry.models import GpuSample
    from telemetry.tasks import samples_ingest

    _node, secret = registered_node
    samples = [
        {"gpu_uuid": "GPU-aaa", "ts": ts, "util_pct": 50},
        {"gpu_uuid": "GPU-bbb", "ts": time.time(), "util_pct": 50},
    ]
    auth = signed_report("control.samples_ingest", "gpu01", [samples], secret)

    assert samples_ingest("gpu01", auth, samples) == "ok"

    assert list(GpuSample.objects.values_list("gpu__uuid", flat=True)) == ["GPU-bbb"]


def test_a_nonce_is_recorded_once_and_pruned_once_its_report_could_not_be_accepted(
    registered_node: Any,
) -> None:
    later = timezone.now() + timedelta(minutes=10)
    assert ReportNonce.claim(nonce="a" * 32, node_name="gpu01", expires_at=later)
    assert not ReportNonce.claim(nonce="a" * 32, node_name="gpu01", expires_at=later)

    _node, secret = registered_node
    info = {"ts": time.time(), "running_job_ids": []}
    auth = signed_report("control.node_heartbeat", "gpu01", [info], secret, ttl_s=300)
    assert node_heartbeat("gpu01", auth, info) == "ok"
    kept = ReportNonce.objects.get(nonce=auth["nonce"]).expires_at
    assert kept == datetime.fromtimestamp(auth["exp"], tz=UTC) + timedelta(minutes=1)

    with time_machine.travel(kept + timedelta(seconds=1), tick=False):
        nodes_check_liveness()
    assert set(ReportNonce.objects.values_list("nonce", flat=True)) == {"a" * 32}
    with time_machine.travel(later + timedelta(seconds=1), tick=False):
        nodes_check_liveness()
    assert not ReportNonce.objects.exists()


LIVENESS = override_settings(
    LABPORTAL_NODE_DOWN_AFTER_S=60, LABPORTAL_NODE_LOST_GRACE_S=300, LABPORTAL_LIVENESS_CHECK_S=15
)


def beats(start: datetime, until_s: float, every_s: float = 15) -> list[dict[str, Any]]:
    """The liveness beat every `every_s` from `start` to `start + until_s`, as Celery beat runs it."""
    results = []
    at = 0.0
    while at <= until_s:
        with time_machine.travel(start + timedelta(seconds=at), tick=False):
            results.append(nodes_check_liveness())
        at += every_s
    return results


@LIVENESS
def test_a_node_is_not_called_silent_for_a_time_the_control_side_could_not_hear(
    running_job: Job,
) -> None:
    start = timezone.now()
    beats(start, 30)
    # The broker (or the database) is away for 90 s: no beat runs, no heartbeat arrives.
    # The first beat after it must not take the node's silence for its death.
    after = start + timedelta(seconds=120)
    assert beats(after, 45)[0] == {"marked_down": [], "jobs_lost": {}}
    assert Node.objects.get(name="gpu01").state == Node.State.UP

    # Heard again for a whole LABPORTAL_NODE_DOWN_AFTER_S without a word from the node: down.
    assert any(r["marked_down"] == ["gpu01"] for r in beats(after + timedelta(seconds=60), 0))
    running_job.refresh_from_db()
    assert running_job.state == Job.State.RUNNING


@LIVENESS
def test_the_lost_grace_does_not_count_a_time_the_control_side_could_not_hear(
    running_job: Job,
) -> None:
    start = timezone.now()
    beats(start, 120)
    assert Node.objects.get(name="gpu01").state == Node.State.DOWN
    # Deaf for 400 s: longer than the grace, which must not expire across it.
    back = start + timedelta(seconds=520)
    beats(back, 285)
    running_job.refresh_from_db()
    assert running_job.state == Job.State.RUNNING

    beats(back + timedelta(seconds=300), 15)
    running_job.refresh_from_db()
    assert running_job.state == Job.State.LOST


def test_the_first_liveness_check_starts_the_control_clock(db: Any) -> None:
    now = timezone.now()
    nodes_check_liveness()
    clock = ControlClock.objects.get()
    assert clock.listening_since >= now

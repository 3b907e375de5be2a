"""Idle sessions are culled as JupyterHub's culler does: warned at the rule's window, stopped after its grace."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.utils import timezone

from accounts.models import Notification
from alerts import rules
from alerts.models import Alert, AlertRule, Kind
from alerts.services import alerts_evaluate
from jobqueue.models import Job
from sessions.status import SessionStatus
from tests.sessions.conftest import running_session

pytestmark = pytest.mark.django_db


def reporting(
    owner: Any,
    image: Any,
    monkeypatch: pytest.MonkeyPatch,
    *,
    started_ago: timedelta,
    **status: Any,
) -> Job:
    """A running session, started ``started_ago``, whose probes answer ``status``; the
    idle-session rule warns at 10 minutes and stops 10 minutes later."""
    AlertRule.objects.create(kind=Kind.IDLE_SESSION, threshold=0, window_s=600, grace_s=600)
    job = running_session(owner, image, gateway="http://127.0.0.1:9")
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - started_ago)
    monkeypatch.setattr(
        rules, "session_status", lambda job, username: SessionStatus(ready=True, **status)
    )
    return job


def test_an_idle_session_is_warned_then_stopped_with_reason_idle(
    cluster: Any, alice: Any, image: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    AlertRule.objects.create(kind=Kind.IDLE_SESSION, threshold=0, window_s=600, grace_s=600)
    t0 = timezone.now()
    job = running_session(alice, image, gateway="http://127.0.0.1:9")
    Job.objects.filter(pk=job.pk).update(started_at=t0 - timedelta(hours=1))
    last = (t0 - timedelta(minutes=20)).timestamp()
    monkeypatch.setattr(
        rules, "session_status", lambda job, username: SessionStatus(ready=True, last_activity=last)
    )

    with time_machine.travel(t0, tick=False):
        alerts_evaluate(now=t0)
    alert = Alert.objects.get(kind=Kind.IDLE_SESSION)
    assert alert.job_id == job.pk and alert.action_taken_at is None
    assert Notification.objects.filter(user=alice, kind="alert_idle_session").exists()
    assert Job.objects.get(pk=job.pk).stop_requested_at is None

    later = t0 + timedelta(minutes=11)
    with time_machine.travel(later, tick=False):
        alerts_evaluate(now=later)
    job.refresh_from_db()
    assert job.stop_requested_at is not None and job.end_reason == "idle"


def test_activity_resolves_the_warning(
    cluster: Any, alice: Any, image: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    AlertRule.objects.create(kind=Kind.IDLE_SESSION, threshold=0, window_s=600, grace_s=600)
    t0 = timezone.now()
    job = running_session(alice, image, gateway="http://127.0.0.1:9")
    Job.objects.filter(pk=job.pk).update(started_at=t0 - timedelta(hours=1))
    status = {"last": (t0 - timedelta(minutes=20)).timestamp()}
    monkeypatch.setattr(
        rules,
        "session_status",
        lambda job, username: SessionStatus(ready=True, last_activity=status["last"]),
    )
    alerts_evaluate(now=t0)
    status["last"] = (t0 + timedelta(minutes=5)).timestamp()  # a cell ran
    alerts_evaluate(now=t0 + timedelta(minutes=11))
    assert not Alert.objects.open().filter(kind=Kind.IDLE_SESSION).exists()
    assert Job.objects.get(pk=job.pk).stop_requested_at is None


def test_a_session_whose_gateway_does_not_answer_is_not_judged(
    cluster: Any, alice: Any, image: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    t0 = timezone.now()
    job = running_session(alice, image, gateway="http://127.0.0.1:9")
    Job.objects.filter(pk=job.pk).update(started_at=t0 - timedelta(days=1))
    monkeypatch.setattr(
        rules,
        "session_status",
        lambda job, username: SessionStatus(ready=False, problem="gateway unreachable"),
    )
    alerts_evaluate(now=t0)
    assert not Alert.objects.filter(kind=Kind.IDLE_SESSION).exists()


def test_a_batch_job_is_never_culled_as_a_session(
    cluster: Any, alice: Any, image: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobqueue.submit import job_submit

    t0 = timezone.now()
    job = job_submit(owner=alice, queue="normal", image=image.reference, command="true")
    Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING, started_at=t0 - timedelta(days=1))
    asked: list[int] = []

    def probe(job: Job, username: str) -> SessionStatus:
        asked.append(job.pk)
        return SessionStatus(ready=True)

    monkeypatch.setattr(rules, "session_status", probe)
    alerts_evaluate(now=t0)
    assert asked == []


def test_a_session_whose_kernel_runs_a_cell_is_never_culled(
    cluster: Any, alice: Any, image: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A quiet training cell: nothing through the proxy for two hours, the kernel busy.
    t0 = timezone.now()
    last = (t0 - timedelta(hours=2)).timestamp()
    reporting(
        alice, image, monkeypatch, started_ago=timedelta(hours=3), last_activity=last, busy=True
    )
    alerts_evaluate(now=t0)
    assert not Alert.objects.filter(kind=Kind.IDLE_SESSION).exists()


def test_a_session_whose_gpus_work_is_in_use_and_one_that_holds_them_idle_is_culled(
    cluster: Any, alice: Any, image: Any, monkeypatch: pytest.MonkeyPatch, evaluate: Any
) -> None:
    from cluster.models import Gpu
    from jobqueue.models import Allocation
    from tests.alerts.conftest import samples

    t0 = timezone.now().replace(microsecond=0)
    last = (t0 - timedelta(minutes=30)).timestamp()
    job = reporting(alice, image, monkeypatch, started_ago=timedelta(hours=1), last_activity=last)
    gpu = Gpu.objects.filter(node__name="gpu01").order_by("index").first()
    assert gpu is not None
    Allocation.objects.create(job=job, gpu=gpu, allocated_at=t0 - timedelta(hours=1))
    # Busy GPUs (the idle-GPU rule's measure) within the window: the session is used.
    samples(gpu, start=t0 - timedelta(minutes=9), end=t0, util=85.0)
    evaluate(t0)
    assert not Alert.objects.filter(kind=Kind.IDLE_SESSION).exists()

    # Ten minutes later the GPU has sat at 0 % for the whole window: warned.
    later = t0 + timedelta(minutes=11)
    samples(gpu, start=t0 + timedelta(seconds=30), end=later, util=0.0)
    evaluate(later)
    assert Alert.objects.get(kind=Kind.IDLE_SESSION).job_id == job.pk

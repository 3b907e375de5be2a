"""Preemption beyond emergencies and bookings, through a real pass (issue 31): a job that
has starved may requeue another member's preemptible job, which is charged exactly for
the time it ran and comes back under a new attempt; a job not marked preemptible is never
stopped. The engine's rules (the share reason, the minimum run) are in
tests/scheduler/test_engine.py and tests/scheduler/test_properties.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from accounts.models import LedgerEntry
from credits.services import gpu_cost, job_rate
from jobqueue.models import Job, JobEvent, SchedulingPolicy
from scheduling.agent_events import job_event_apply
from scheduling.passes import scheduling_pass
from tests.jobqueue.test_lifecycle import dispatched, event, node_name
from tests.jobqueue.test_submit import submit

pytestmark = pytest.mark.django_db


def _fill_the_cluster(bob: Any, capture: Any, *, preemptible: bool) -> list[Job]:
    """bob runs two 4-GPU jobs on the two 4-GPU nodes, started an hour ago."""
    jobs = [dispatched(bob, capture, gpus=4, preemptible=preemptible) for _ in range(2)]
    for job in jobs:
        job_event_apply(node_name=node_name(job), event=event(job, "started"))
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(
        started_at=timezone.now() - timedelta(hours=1)
    )
    return jobs


def _starving(alice: Any) -> Job:
    job = submit(alice, gpus=4)
    Job.objects.filter(pk=job.pk).update(submitted_at=timezone.now() - timedelta(hours=13))
    return job


def test_a_starving_job_requeues_one_preemptible_job_charged_for_its_run(
    alice: Any,
    bob: Any,
    cluster: Any,
    image: Any,
    django_capture_on_commit_callbacks: Any,
    sent_tasks: Any,
) -> None:
    bobs = _fill_the_cluster(bob, django_capture_on_commit_callbacks, preemptible=True)
    waiting = _starving(alice)
    with django_capture_on_commit_callbacks(execute=True):
        scheduling_pass()
    stops = sent_tasks.named("agent.stop_job")
    assert [args[2] for _, args, _ in stops] == ["preempted"]
    (victim,) = [j for j in bobs if j.pk == stops[0][1][0]]
    victim.refresh_from_db()
    assert victim.stop_requested_at is not None
    message = JobEvent.objects.get(job=victim, kind="preempting").message
    assert message.startswith("Preempted for a job that had waited past the lab's limit")
    waiting.refresh_from_db()
    assert (waiting.state, waiting.pending_reason) == (Job.State.PENDING, "preempting")

    started, stop_asked, rate = victim.started_at, victim.stop_requested_at, job_rate(victim)
    assert started is not None
    with django_capture_on_commit_callbacks(execute=True):
        job_event_apply(node_name=node_name(victim), event=event(victim, "exited", exit_code=143))
    victim.refresh_from_db()
    assert victim.state == Job.State.PENDING and victim.started_at is None
    assert victim.dispatch_count == 1  # the next dispatch is attempt 2
    assert victim.preemption_count == 1
    # Charged from its start to the stop request, at the preemptible rate, once.
    charged = -sum(
        e.amount for e in LedgerEntry.objects.filter(job=victim, kind=LedgerEntry.Kind.CHARGE)
    )
    seconds = int((stop_asked - started).total_seconds())
    assert charged == gpu_cost(gpus=4, seconds=seconds, rate=rate) > 0
    with django_capture_on_commit_callbacks(execute=True):
        scheduling_pass()
    waiting.refresh_from_db()
    victim.refresh_from_db()
    assert waiting.state == Job.State.DISPATCHED
    assert victim.state == Job.State.PENDING  # the starving job has its GPUs now
    # The other of bob's jobs was not touched.
    (other,) = [j for j in bobs if j.pk != victim.pk]
    other.refresh_from_db()
    assert other.state == Job.State.RUNNING and other.stop_requested_at is None
    assert other.preemption_count == 0


def test_jobs_preempted_as_often_as_the_lab_allows_are_not_stopped_again_for_a_waiting_job(
    alice: Any,
    bob: Any,
    cluster: Any,
    image: Any,
    django_capture_on_commit_callbacks: Any,
    sent_tasks: Any,
) -> None:
    assert SchedulingPolicy.current().preempt_max_times == 2  # the lab's default
    bobs = _fill_the_cluster(bob, django_capture_on_commit_callbacks, preemptible=True)
    Job.objects.filter(pk__in=[j.pk for j in bobs]).update(preemption_count=2)
    waiting = _starving(alice)
    with django_capture_on_commit_callbacks(execute=True):
        scheduling_pass()
    assert not sent_tasks.named("agent.stop_job")
    waiting.refresh_from_db()
    assert waiting.pending_reason == "resources"
    # bob's job page says how often it was stopped; the rules page says where the cap is.
    client = Client()
    client.force_login(bob)
    page = client.get(f"/jobs/{bobs[0].pk}/").content.decode()
    assert "yes: preempted and requeued 2 times so far" in page
    rules = client.get("/rules/").content.decode()
    assert "and no more once it has been preempted 2 times." in rules
    # With no cap the starving job stops one of them.
    SchedulingPolicy.objects.update(preempt_max_times=None)
    with django_capture_on_commit_callbacks(execute=True):
        scheduling_pass()
    assert [args[2] for _, args, _ in sent_tasks.named("agent.stop_job")] == ["preempted"]


@pytest.mark.parametrize(
    ("preemptible", "changes"),
    [
        (False, {}),  # not marked preemptible: never stopped, whatever the settings
        (True, {"preempt_starving_after_s": None, "preempt_share_after_s": None}),  # both off
    ],
)
def test_a_starving_job_waits_where_nothing_may_be_preempted(
    preemptible: bool,
    changes: dict[str, Any],
    alice: Any,
    bob: Any,
    cluster: Any,
    image: Any,
    django_capture_on_commit_callbacks: Any,
    sent_tasks: Any,
) -> None:
    SchedulingPolicy.current()
    SchedulingPolicy.objects.update(**changes)
    _fill_the_cluster(bob, django_capture_on_commit_callbacks, preemptible=preemptible)
    waiting = _starving(alice)
    with django_capture_on_commit_callbacks(execute=True):
        scheduling_pass()
    assert not sent_tasks.named("agent.stop_job")
    waiting.refresh_from_db()
    assert waiting.pending_reason == "resources"


def test_a_member_under_their_share_preempts_a_member_over_theirs(
    alice: Any,
    bob: Any,
    cluster: Any,
    image: Any,
    django_capture_on_commit_callbacks: Any,
    sent_tasks: Any,
) -> None:
    # Starvation off: alice (nothing used) still preempts bob (the whole lab for an hour)
    # for her share.
    SchedulingPolicy.current()
    SchedulingPolicy.objects.update(preempt_starving_after_s=None)
    _fill_the_cluster(bob, django_capture_on_commit_callbacks, preemptible=True)
    _starving(alice)
    with django_capture_on_commit_callbacks(execute=True):
        scheduling_pass()
    stops = sent_tasks.named("agent.stop_job")
    assert len(stops) == 1
    message = JobEvent.objects.get(job_id=stops[0][1][0], kind="preempting").message
    assert message.startswith("Preempted for a member under their fair share")


@pytest.mark.parametrize(
    ("language", "words"),
    [
        ("en", ["for another member's job that has waited more than 12 hours", "10 minutes"]),
        ("zh-hans", ["为其他成员等待超过 12 小时的作业", "已运行 15 分钟之后"]),
    ],
)
def test_the_rules_page_states_when_a_preemptible_job_may_be_stopped(
    alice: Any, queues: Any, language: str, words: list[str]
) -> None:
    client = Client(headers={"accept-language": language})
    client.force_login(alice)
    page = client.get("/rules/").content.decode()
    for text in words:
        assert text in page, text
    SchedulingPolicy.objects.update(preempt_starving_after_s=None, preempt_share_after_s=None)
    page = client.get("/rules/").content.decode()
    assert 'data-testid="rules-preemption"' in page
    assert 'data-testid="rules-preempt-starving"' not in page
    assert 'data-testid="rules-preempt-share"' not in page

"""A job's end, applied by a control worker, starts the next job there and then (no queued pass)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from jobqueue.models import Allocation, Job, SchedulerLock
from scheduling import passes as scheduling
from scheduling.agent_events import job_event_apply
from scheduling.passes import passes_inline, scheduling_pass
from tests.jobqueue.test_submit import submit

# Real commits: what runs after a commit is what is tested.
pytestmark = pytest.mark.django_db(transaction=True)


def exited(job: Job) -> dict[str, Any]:
    return {
        "event_id": f"{job.pk}:exited:c1",
        "job_id": job.pk,
        "kind": "exited",
        "container_id": "c1",
        "ts": timezone.now().timestamp(),
        "exit_code": 0,
    }


def fill_cluster(owner: Any, waiting: int) -> tuple[list[Job], list[Job]]:
    """Eight 1-GPU jobs on the 8 GPUs, and `waiting` more behind them."""
    jobs = [submit(owner) for _ in range(8 + waiting)]
    scheduling_pass()
    running = [j for j in jobs if Job.objects.get(pk=j.pk).state == Job.State.DISPATCHED]
    assert len(running) == 8
    return running, [j for j in jobs if j not in running]


def gpus_of(job: Job) -> set[int]:
    return set(Allocation.objects.filter(job=job, active=True).values_list("gpu_id", flat=True))


def end_inline(job: Job) -> None:
    """The end as the control worker applies it (scheduling.tasks.job_event)."""
    job.refresh_from_db()
    assert job.node is not None
    with passes_inline():
        job_event_apply(node_name=job.node.name, event=exited(job))


def test_the_end_of_a_job_starts_the_next_one_on_its_gpu_without_a_queued_pass(
    alice: Any, cluster: Any, image: Any, sent_tasks: Any
) -> None:
    running, waiting = fill_cluster(alice, waiting=2)
    passes_before = len(sent_tasks.named("control.scheduling_pass"))
    ended = running[0]
    freed = gpus_of(ended)

    end_inline(ended)

    first = Job.objects.get(pk=waiting[0].pk)
    assert first.state == Job.State.DISPATCHED  # the oldest waiting job, on the freed GPU
    assert gpus_of(first) == freed
    assert Job.objects.get(pk=waiting[1].pk).state == Job.State.PENDING
    starts = [a for name, a, _q in sent_tasks if name == "agent.start_job"]
    assert starts[-1][0]["job_id"] == first.pk
    assert len(sent_tasks.named("control.scheduling_pass")) == passes_before  # none queued


def test_an_end_while_a_pass_is_already_requested_leaves_the_start_to_that_pass(
    alice: Any, cluster: Any, image: Any, sent_tasks: Any
) -> None:
    running, waiting = fill_cluster(alice, waiting=1)
    # A pass is requested and queued (a submit's, say) but has not loaded the state yet.
    SchedulerLock.objects.update_or_create(
        name=scheduling.REQUEST_ROW, defaults={"pass_requested": True}
    )

    end_inline(running[0])

    assert Job.objects.get(pk=waiting[0].pk).state == Job.State.PENDING
    scheduling_pass()  # the requested pass: it sees the freed GPU
    assert Job.objects.get(pk=waiting[0].pk).state == Job.State.DISPATCHED


def test_passes_at_job_ends_store_places_at_most_every_few_seconds_and_others_always(
    alice: Any, cluster: Any, image: Any
) -> None:
    running, waiting = fill_cluster(alice, waiting=3)
    assert [Job.objects.get(pk=j.pk).queue_position for j in waiting] == [1, 2, 3]

    end_inline(running[0])  # the pass just stored: no store

    assert Job.objects.get(pk=waiting[0].pk).state == Job.State.DISPATCHED
    assert [Job.objects.get(pk=j.pk).queue_position for j in waiting[1:]] == [2, 3]  # as stored
    scheduling_pass()  # any other pass (a submit's, beat's) stores
    assert [Job.objects.get(pk=j.pk).queue_position for j in waiting[1:]] == [1, 2]


def test_a_pass_at_a_job_end_that_will_not_store_skips_the_forecast_and_others_make_it(
    alice: Any, cluster: Any, image: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    running, waiting = fill_cluster(alice, waiting=3)
    asked: list[bool] = []
    real_plan = scheduling.engine_plan

    def recording_plan(*args: Any, estimates: bool = True) -> Any:
        asked.append(estimates)
        return real_plan(*args, estimates=estimates)

    monkeypatch.setattr(scheduling, "engine_plan", recording_plan)
    end_inline(running[0])  # figures stored just now: no store, so no forecast
    SchedulerLock.objects.filter(name=scheduling.STORE_ROW).update(
        last_pass_at=timezone.now() - timedelta(seconds=scheduling.INLINE_STORE_INTERVAL_S + 1)
    )
    end_inline(running[1])  # figures older than the interval: this one stores them
    scheduling_pass()  # any other pass forecasts

    assert asked == [False, True, True]
    assert Job.objects.get(pk=waiting[0].pk).state == Job.State.DISPATCHED
    assert Job.objects.get(pk=waiting[1].pk).state == Job.State.DISPATCHED
    third = Job.objects.get(pk=waiting[2].pk)
    assert third.queue_position == 1 and third.estimated_start is not None


def test_a_pass_that_finds_another_requested_still_stores_once_figures_are_old(
    alice: Any, cluster: Any, image: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    running, waiting = fill_cluster(alice, waiting=3)
    Job.objects.filter(pk=running[0].pk).update(state=Job.State.COMPLETED)
    Allocation.objects.filter(job_id=running[0].pk).update(active=False)
    real_input = scheduling.build_engine_input

    def requested_again_during_the_pass(now: Any) -> Any:
        # Requests keep coming: each pass finds a new one when it is done.
        SchedulerLock.objects.update_or_create(
            name=scheduling.REQUEST_ROW, defaults={"pass_requested": True}
        )
        return real_input(now)

    monkeypatch.setattr(scheduling, "build_engine_input", requested_again_during_the_pass)
    scheduling_pass()  # figures were stored just now: the requested pass will store
    assert Job.objects.get(pk=waiting[0].pk).state == Job.State.DISPATCHED
    assert [Job.objects.get(pk=j.pk).queue_position for j in waiting[1:]] == [2, 3]
    SchedulerLock.objects.filter(name=scheduling.STORE_ROW).update(
        last_pass_at=timezone.now() - timedelta(seconds=scheduling.STORE_MAX_LAG_S + 1)
    )
    scheduling_pass()  # still requested, but the figures are too old to wait longer
    assert [Job.objects.get(pk=j.pk).queue_position for j in waiting[1:]] == [1, 2]


def test_a_failing_pass_at_a_job_end_is_queued_instead_and_the_end_stands(
    alice: Any,
    cluster: Any,
    image: Any,
    sent_tasks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    running, waiting = fill_cluster(alice, waiting=1)
    passes_before = len(sent_tasks.named("control.scheduling_pass"))

    def broken(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("database went away")

    monkeypatch.setattr(scheduling, "build_engine_input", broken)
    end_inline(running[0])

    assert Job.objects.get(pk=running[0].pk).state == Job.State.COMPLETED
    assert len(sent_tasks.named("control.scheduling_pass")) == passes_before + 1


def test_the_control_worker_runs_the_pass_where_it_applies_an_agents_end(
    alice: Any, cluster: Any, image: Any, sent_tasks: Any
) -> None:
    from cluster.models import NodeToken
    from scheduling.tasks import job_event

    running, waiting = fill_cluster(alice, waiting=1)
    passes_before = len(sent_tasks.named("control.scheduling_pass"))
    ended = Job.objects.select_related("node").get(pk=running[0].pk)
    assert ended.node is not None
    _token, secret = NodeToken.issue(node_name=ended.node.name)

    assert job_event(ended.node.name, secret, exited(ended)) == "ok"

    assert Job.objects.get(pk=waiting[0].pk).state == Job.State.DISPATCHED
    assert len(sent_tasks.named("control.scheduling_pass")) == passes_before


def test_the_next_start_goes_out_before_the_ends_settle_and_notification(
    alice: Any, cluster: Any, image: Any, sent_tasks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accounts import services as account_services
    from accounts.models import Notification
    from credits import services as credit_services

    running, waiting = fill_cluster(alice, waiting=1)
    settle, notify = credit_services.credits_settle_job, account_services.notify

    def settle_recorded(**kwargs: Any) -> None:
        sent_tasks.append(("settle", [kwargs["job_id"]], ""))
        settle(**kwargs)

    def notify_recorded(**kwargs: Any) -> Any:
        sent_tasks.append(("notify", [kwargs["dedupe_key"]], ""))
        return notify(**kwargs)

    monkeypatch.setattr(credit_services, "credits_settle_job", settle_recorded)
    monkeypatch.setattr(account_services, "notify", notify_recorded)

    end_inline(running[0])

    order = [name for name, _a, _q in sent_tasks if name in ("agent.start_job", "settle", "notify")]
    # The fill's 8 starts, then the freed GPU's next start, and only then the end's follow-ups.
    assert order[8:] == ["agent.start_job", "settle", "notify"]
    assert Notification.objects.filter(dedupe_key__startswith=f"job-end:{running[0].pk}:").exists()
    assert Job.objects.get(pk=waiting[0].pk).state == Job.State.DISPATCHED


def test_a_settle_lost_after_the_end_is_made_up_once_by_the_sweep(
    alice: Any, cluster: Any, image: Any, sent_tasks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accounts.models import JobEfficiency, LedgerEntry, Notification
    from credits import services as credit_services

    running, waiting = fill_cluster(alice, waiting=1)
    ended = running[0]
    an_hour_ago = timezone.now() - timedelta(hours=1)
    Job.objects.filter(pk=ended.pk).update(dispatched_at=an_hour_ago, started_at=an_hour_ago)
    settle = credit_services.credits_settle_job

    def worker_dies(**_kwargs: Any) -> None:
        raise RuntimeError("the worker died after the commit")

    monkeypatch.setattr(credit_services, "credits_settle_job", worker_dies)
    end_inline(ended)  # the failed settle neither undoes the end nor holds back the rest

    assert Job.objects.get(pk=ended.pk).state == Job.State.COMPLETED
    assert Job.objects.get(pk=waiting[0].pk).state == Job.State.DISPATCHED
    assert Notification.objects.filter(dedupe_key__startswith=f"job-end:{ended.pk}:").exists()
    assert not JobEfficiency.objects.filter(job=ended).exists()
    assert not LedgerEntry.objects.filter(job=ended).exists()

    monkeypatch.setattr(credit_services, "credits_settle_job", settle)
    # Not within the grace: a settle may still be on its way.
    assert credit_services.credits_settle_ended_jobs() == 0
    later = timezone.now() + timedelta(seconds=credit_services.SETTLE_SWEEP_GRACE_S + 1)
    assert credit_services.credits_settle_ended_jobs(now=later) == 1
    charges = list(LedgerEntry.objects.filter(job=ended).values_list("kind", "amount"))
    assert len(charges) == 1 and charges[0][0] == LedgerEntry.Kind.CHARGE and charges[0][1] < 0
    assert JobEfficiency.objects.filter(job=ended).exists()
    # Settled once: the next sweeps find nothing, and charge nothing again.
    assert credit_services.credits_settle_ended_jobs(now=later) == 0
    assert list(LedgerEntry.objects.filter(job=ended).values_list("kind", "amount")) == charges


def test_the_sweep_leaves_a_job_settled_at_its_end_alone(
    alice: Any, cluster: Any, image: Any, sent_tasks: Any
) -> None:
    from accounts.models import LedgerEntry
    from credits import services as credit_services

    running, _waiting = fill_cluster(alice, waiting=0)
    an_hour_ago = timezone.now() - timedelta(hours=1)
    Job.objects.filter(pk=running[0].pk).update(dispatched_at=an_hour_ago, started_at=an_hour_ago)
    end_inline(running[0])  # settled at its end
    entries = LedgerEntry.objects.count()  # with alice's first grant when she was created
    assert LedgerEntry.objects.filter(job=running[0]).count() == 1
    later = timezone.now() + timedelta(seconds=credit_services.SETTLE_SWEEP_GRACE_S + 1)
    assert credit_services.credits_settle_ended_jobs(now=later) == 0
    assert LedgerEntry.objects.count() == entries

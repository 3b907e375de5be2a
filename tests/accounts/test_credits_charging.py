"""Charging running jobs, settling finished ones, refunds, rewards and the monthly grant."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import time_machine

from accounts.models import CreditAccount, CreditPolicy, JobEfficiency, LedgerEntry, Notification
from accounts.selectors import credit_summary
from accounts.services import credits_monthly_grant, ledger_post
from credits.services import credits_charge_running_jobs, credits_refund_job, credits_settle_job
from jobqueue.models import Job
from tests.factories import ContainerImageFactory, GpuFactory, default_queue

pytestmark = pytest.mark.django_db

T0 = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)


def running_job(owner: Any, *, gpus: int = 2, started: datetime = T0, queue: str = "normal") -> Job:
    q = default_queue(queue)
    q.credit_rate = Decimal("1.000")
    q.save()
    return Job.objects.create(
        owner=owner,
        queue=q,
        image=ContainerImageFactory.create(),
        command=["python", "train.py"],
        gpus=gpus,
        time_limit_s=86400,
        state=Job.State.RUNNING,
        started_at=started,
    )


def finish(job: Job, *, at: datetime, state: str = Job.State.COMPLETED) -> None:
    job.state, job.ended_at = state, at
    job.save()


def balance(user: Any) -> Decimal:
    return CreditAccount.objects.get(user=user).balance


def charges(job: Job) -> Decimal:
    return sum((e.amount for e in LedgerEntry.objects.filter(job=job, kind="charge")), Decimal("0"))


def test_running_jobs_are_charged_gpu_hours_times_the_rate_up_to_the_window(alice: Any) -> None:
    job = running_job(alice, gpus=2)
    assert credits_charge_running_jobs(now=T0 + timedelta(hours=1, minutes=2)) == 1
    # 2 GPUs × 1 h (the window ends at 13:00) × 1 credit/GPU-hour
    assert charges(job) == Decimal("-2.000")
    credits_charge_running_jobs(now=T0 + timedelta(hours=1, minutes=31))
    assert charges(job) == Decimal("-3.000")


def test_every_charge_delivered_twice_is_charged_once(alice: Any) -> None:
    job = running_job(alice)
    for _delivery in range(2):
        credits_charge_running_jobs(now=T0 + timedelta(minutes=30))
        credits_charge_running_jobs(now=T0 + timedelta(minutes=34))  # same 5-minute window
    assert LedgerEntry.objects.filter(job=job).count() == 1
    assert charges(job) == Decimal("-1.000")
    finish(job, at=T0 + timedelta(minutes=45))
    for _delivery in range(2):
        credits_settle_job(job_id=job.pk)
    assert charges(job) == Decimal("-1.500")
    assert balance(alice) == Decimal("-1.500")
    assert not CreditAccount.objects.inconsistent().exists()


def test_a_settled_job_is_never_charged_again_by_a_late_charging_run(alice: Any) -> None:
    job = running_job(alice)
    finish(job, at=T0 + timedelta(minutes=20))
    credits_settle_job(job_id=job.pk)
    credits_charge_running_jobs(now=T0 + timedelta(hours=3))
    assert charges(job) == Decimal("-0.667")


def test_the_final_charge_gives_back_an_overcharge_when_the_job_ended_before_the_last_window(
    alice: Any,
) -> None:
    job = running_job(alice, gpus=1)
    credits_charge_running_jobs(now=T0 + timedelta(hours=2))
    finish(job, at=T0 + timedelta(hours=1))  # the agent's finish event arrived late
    credits_settle_job(job_id=job.pk)
    assert charges(job) == Decimal("-1.000")


def test_a_job_that_never_started_costs_nothing(alice: Any) -> None:
    job = running_job(alice)
    Job.objects.filter(pk=job.pk).update(state=Job.State.CANCELLED, started_at=None)
    credits_settle_job(job_id=job.pk)
    assert not LedgerEntry.objects.exists()


def test_a_lost_job_is_refunded_in_full_once_with_a_note(alice: Any) -> None:
    ledger_post(user=alice, amount=Decimal("100"), kind="grant", idempotency_key="g")
    job = running_job(alice, gpus=4)
    credits_charge_running_jobs(now=T0 + timedelta(hours=2))
    assert balance(alice) == Decimal("92.000")
    finish(job, at=T0 + timedelta(hours=2, minutes=3), state=Job.State.LOST)
    credits_refund_job(job_id=job.pk, reason="node gpu01 went down")
    credits_refund_job(job_id=job.pk, reason="node gpu01 went down")
    credits_settle_job(job_id=job.pk)  # settling a lost job refunds, never charges
    refund = LedgerEntry.objects.get(job=job, kind="refund")
    assert refund.amount == Decimal("8.000")
    assert refund.note == "node gpu01 went down"
    assert balance(alice) == Decimal("100.000")


def samples(job: Job, utils: list[float]) -> None:
    from telemetry.models import GpuSample

    gpu = GpuFactory.create()
    for i, util in enumerate(utils):
        GpuSample.objects.create(
            gpu=gpu, ts=T0 + timedelta(minutes=i + 1), util_pct=util, job_id=job.pk
        )


def test_an_efficient_job_earns_back_a_share_of_its_charge(alice: Any) -> None:
    CreditPolicy.objects.update_or_create(
        pk=1, defaults={"efficiency_threshold_pct": 70, "efficiency_reward_share": Decimal("0.1")}
    )
    job = running_job(alice, gpus=2)
    samples(job, [90, 80, 85])
    finish(job, at=T0 + timedelta(hours=5))
    credits_settle_job(job_id=job.pk)
    credits_settle_job(job_id=job.pk)
    reward = LedgerEntry.objects.get(job=job, kind="reward")
    assert reward.amount == Decimal("1.000")  # 10 % of 2 GPUs × 5 h
    assert JobEfficiency.objects.get(job=job).verdict == "rewarded"


def test_an_idle_job_gets_no_reward_and_is_flagged(alice: Any) -> None:
    job = running_job(alice)
    samples(job, [0, 1, 2])
    finish(job, at=T0 + timedelta(hours=1))
    credits_settle_job(job_id=job.pk)
    assert not LedgerEntry.objects.filter(kind="reward").exists()
    assert JobEfficiency.objects.get(job=job).verdict == "idle"
    assert Notification.objects.filter(user=alice, kind="job_idle").count() == 1


def test_a_job_without_samples_is_neither_rewarded_nor_flagged(alice: Any) -> None:
    job = running_job(alice)
    finish(job, at=T0 + timedelta(hours=1))
    credits_settle_job(job_id=job.pk)
    assert JobEfficiency.objects.get(job=job).verdict == "unknown"
    assert not Notification.objects.filter(kind="job_idle").exists()


def test_the_monthly_grant_is_the_base_times_the_category_multiplier(
    alice: Any, charlie: Any
) -> None:
    CreditPolicy.objects.update_or_create(pk=1, defaults={"base_grant": Decimal("1000")})
    charlie.category.credit_multiplier = Decimal("0.5")
    charlie.category.save()
    assert credits_monthly_grant(month=date(2025, 3, 1)) == 2
    assert balance(alice) == Decimal("1000")
    assert balance(charlie) == Decimal("500")
    assert Notification.objects.filter(user=alice, kind="credits_grant").count() == 1


def test_running_the_grant_twice_in_a_month_grants_once(alice: Any) -> None:
    credits_monthly_grant(month=date(2025, 3, 1))
    assert credits_monthly_grant(month=date(2025, 3, 17)) == 0
    assert LedgerEntry.objects.filter(kind="grant").count() == 1


def test_inactive_and_unapproved_members_get_no_grant(alice: Any, bob: Any, charlie: Any) -> None:
    bob.is_active = False
    bob.save()
    charlie.approval = "pending"
    charlie.save()
    credits_monthly_grant(month=date(2025, 3, 1))
    assert set(LedgerEntry.objects.values_list("account__user__username", flat=True)) == {"alice"}


@pytest.mark.parametrize(
    ("mode", "left_over", "expected"),
    [
        ("none", Decimal("300"), Decimal("1000")),
        ("capped", Decimal("300"), Decimal("1200")),
        ("capped", Decimal("100"), Decimal("1100")),
        ("full", Decimal("300"), Decimal("1300")),
        ("none", Decimal("-50"), Decimal("950")),  # debt is never forgiven
    ],
)
def test_each_carry_over_mode_keeps_what_it_promises(
    alice: Any, mode: str, left_over: Decimal, expected: Decimal
) -> None:
    CreditPolicy.objects.update_or_create(
        pk=1,
        defaults={
            "base_grant": Decimal("1000"),
            "carry_over": mode,
            "carry_over_cap": Decimal("200"),
        },
    )
    ledger_post(user=alice, amount=left_over, kind="adjustment", idempotency_key="left")
    credits_monthly_grant(month=date(2025, 4, 1))
    credits_monthly_grant(month=date(2025, 4, 1))
    assert balance(alice) == expected
    assert not Notification.objects.filter(kind="credits_zero").exists()
    assert not CreditAccount.objects.inconsistent().exists()


def test_the_burn_rate_is_last_weeks_net_spending_per_day(alice: Any) -> None:
    with time_machine.travel(T0 - timedelta(days=10), tick=False):
        ledger_post(user=alice, amount=Decimal("1000"), kind="grant", idempotency_key="g")
        ledger_post(user=alice, amount=Decimal("-500"), kind="charge", idempotency_key="old")
    with time_machine.travel(T0 - timedelta(days=2), tick=False):
        ledger_post(user=alice, amount=Decimal("-70"), kind="charge", idempotency_key="c")
        ledger_post(user=alice, amount=Decimal("7"), kind="reward", idempotency_key="r")
    summary = credit_summary(alice, now=T0)
    assert summary.burn_per_day == Decimal("9.000")
    assert summary.balance == Decimal("437")
    assert summary.runs_out_at is not None
    assert (summary.runs_out_at - T0).days == 48
    assert summary.next_grant_on == date(2025, 4, 1)


def test_a_member_with_zero_credits_still_gets_gpus_on_an_idle_cluster(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from django.utils import timezone

    from scheduling.passes import build_engine_input, scheduling_pass
    from tests.jobqueue.test_submit import submit

    ledger_post(user=alice, amount=Decimal("-5"), kind="adjustment", idempotency_key="debt")
    assert "alice" in build_engine_input(timezone.now())[0].users_without_credit
    job = submit(alice, gpus=2)
    with django_capture_on_commit_callbacks(execute=True):
        scheduling_pass()
    job.refresh_from_db()
    assert job.state == Job.State.DISPATCHED

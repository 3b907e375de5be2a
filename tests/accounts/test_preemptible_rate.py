"""Preemptible work, the lab's way (issue 31): a member who lets the engine stop and requeue
a job pays the admin's share of its queue's rate, is told how long it has to checkpoint
(LABPORTAL_PREEMPT_GRACE_S), and Slurm mode, which does not preempt, refuses the mark."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from accounts.models import CreditPolicy
from credits.services import credits_charge_running_jobs, credits_settle_job
from jobqueue.errors import JobRefused
from jobqueue.models import Job, SchedulingPolicy
from jobqueue.submit import job_submit
from scheduling.dispatch import start_spec
from tests.accounts.test_credits_charging import T0, charges, finish, running_job

pytestmark = pytest.mark.django_db


def test_a_preemptible_job_pays_the_admins_share_of_the_rate(alice: Any, bob: Any) -> None:
    policy = CreditPolicy.current()
    policy.preemptible_rate_pct = 40
    policy.save()
    plain = running_job(alice, gpus=2)
    cheap = running_job(bob, gpus=2)
    Job.objects.filter(pk=cheap.pk).update(preemptible=True)
    credits_charge_running_jobs(now=T0 + timedelta(hours=1, minutes=2))
    assert charges(plain) == Decimal("-2.000")  # 2 GPUs × 1 h × 1 credit
    assert charges(cheap) == Decimal("-0.800")  # the same at 40 %
    cheap.refresh_from_db()
    finish(cheap, at=T0 + timedelta(hours=2))
    credits_settle_job(job_id=cheap.pk)
    assert charges(cheap) == Decimal("-1.600")  # settled at the same share


def test_slurm_mode_charges_the_full_rate_and_refuses_the_mark(
    settings: Any, alice: Any, cluster: Any, image: Any
) -> None:
    job = running_job(alice, gpus=1)
    Job.objects.filter(pk=job.pk).update(preemptible=True)
    settings.LABPORTAL_EXECUTOR = "slurm"
    from credits.services import job_rate

    job.refresh_from_db()
    assert job_rate(job) == job.queue.credit_rate
    with pytest.raises(JobRefused, match="Slurm here does not preempt jobs"):
        job_submit(
            owner=alice, queue="normal", image=image.reference, command="true", preemptible=True
        )


def test_a_preemptible_job_is_told_its_grace_and_others_are_not(
    alice: Any, cluster: Any, image: Any
) -> None:
    policy = SchedulingPolicy.current()
    policy.stop_grace_s = 120
    policy.save()
    job = job_submit(
        owner=alice, queue="normal", image=image.reference, command="true", preemptible=True
    )
    gpu = cluster[0].gpus.first()
    assert start_spec(job, [gpu])["env"]["LABPORTAL_PREEMPT_GRACE_S"] == "120"
    other = job_submit(owner=alice, queue="normal", image=image.reference, command="true")
    assert "LABPORTAL_PREEMPT_GRACE_S" not in start_spec(other, [gpu])["env"]


def test_the_submit_form_states_the_grace_and_the_rate(alice: Any, cluster: Any) -> None:
    policy = SchedulingPolicy.current()
    policy.stop_grace_s = 300
    policy.save()
    client = Client()
    client.force_login(alice)
    page = client.get("/jobs/submit/").content.decode()
    assert "May be stopped (SIGTERM, then 5 min to checkpoint) and requeued" in page
    assert "it pays 50% of the queue&#x27;s rate" in page


def test_the_rules_page_states_the_preemptible_rate(alice: Any, queues: Any) -> None:
    policy = CreditPolicy.current()
    policy.preemptible_rate_pct = 30
    policy.save()
    client = Client()
    client.force_login(alice)
    page = client.get("/rules/").content.decode()
    assert "A job marked preemptible pays 30% of its queue's rate" in page

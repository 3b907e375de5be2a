"""A category's own limits in a queue (the article's "newcomers get more debug allowance"):
they replace the queue's running limits in the scheduling pass, cap GPU-hours per week at
submit, and the database keeps one allowance per (category, queue)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from jobqueue.errors import QuotaExceeded
from jobqueue.models import CategoryQueueAllowance, Job, Queue
from scheduling.passes import scheduling_pass
from tests.factories import CategoryFactory, UserFactory
from tests.jobqueue.test_submit import submit

pytestmark = pytest.mark.django_db


def short_debug(owner: Any) -> Job:
    return submit(owner, queue="debug", time_limit_s=600)


def test_newcomers_run_more_debug_jobs_than_the_queue_allows_others(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    debug = Queue.objects.get(name="debug")
    assert debug.max_running_jobs_per_user == 2
    newcomers = CategoryFactory.create(name="New student")
    newbie = UserFactory(username="newbie", category=newcomers)
    CategoryQueueAllowance.objects.create(
        category=newcomers, queue=debug, max_running_jobs_per_user=4
    )
    theirs = [short_debug(newbie) for _ in range(5)]
    alices = [short_debug(alice) for _ in range(3)]
    with django_capture_on_commit_callbacks(execute=True):
        scheduling_pass()
    started = set(
        Job.objects.filter(state=Job.State.DISPATCHED).values_list("owner__username", "pk")
    )
    assert sum(1 for user, _pk in started if user == "newbie") == 4
    assert sum(1 for user, _pk in started if user == "alice") == 2
    for job in (theirs[-1], alices[-1]):
        job.refresh_from_db()
        assert job.state == Job.State.PENDING and job.pending_reason == "user_limit"


def test_a_weekly_gpu_hours_allowance_refuses_the_job_that_would_pass_it(
    alice: Any, cluster: Any, image: Any
) -> None:
    debug = Queue.objects.get(name="debug")
    CategoryQueueAllowance.objects.create(
        category=alice.category, queue=debug, max_gpu_hours_per_week=2
    )
    # One hour ran last week (counts what it ran, not its limit); one waits (counts its limit).
    ran = submit(alice, queue="debug", time_limit_s=3600)
    now = timezone.now()
    Job.objects.filter(pk=ran.pk).update(
        state=Job.State.COMPLETED,
        started_at=now - timedelta(hours=2),
        ended_at=now - timedelta(hours=1, minutes=30),
    )
    submit(alice, queue="debug", time_limit_s=3600)
    with pytest.raises(
        QuotaExceeded, match=r"1\.0 GPU-hours .* already took 1\.5 of .* 2 GPU-hours"
    ):
        submit(alice, queue="debug", time_limit_s=3600)
    # What still fits is accepted; other queues and other categories are not limited by it.
    assert submit(alice, queue="debug", time_limit_s=1800).pk
    assert submit(alice, queue="normal", time_limit_s=7200).pk
    outsider = UserFactory(username="dave", category=CategoryFactory(name="Staff"))
    assert submit(outsider, queue="debug", time_limit_s=3600).pk


def test_a_category_has_at_most_one_allowance_per_queue(alice: Any, queues: Any) -> None:
    debug = Queue.objects.get(name="debug")
    CategoryQueueAllowance.objects.create(category=alice.category, queue=debug)
    with pytest.raises(IntegrityError), transaction.atomic():
        CategoryQueueAllowance.objects.create(category=alice.category, queue=debug)


def test_an_empty_allowance_limit_keeps_the_queues(alice: Any, queues: Any) -> None:
    debug = Queue.objects.get(name="debug")
    allowance = CategoryQueueAllowance.objects.create(
        category=alice.category, queue=debug, max_running_gpus_per_user=3
    )
    assert allowance.running_jobs_cap() == debug.max_running_jobs_per_user == 2
    assert allowance.running_gpus_cap() == 3

"""On PostgreSQL: concurrent passes and concurrent submit/cancel never allocate a GPU twice."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, connections

from jobqueue.models import Allocation, Job
from jobqueue.scheduling import scheduling_pass
from jobqueue.services import job_cancel
from tests.jobqueue.test_submit import submit

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def run_concurrently(workers: list[Callable[[], Any]]) -> list[BaseException]:
    barrier = threading.Barrier(len(workers))
    errors: list[BaseException] = []

    def wrap(fn: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            fn()
        except BaseException as exc:  # noqa: BLE001 - collected and asserted on
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=wrap, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return errors


def assert_no_gpu_twice() -> None:
    active = Counter(Allocation.objects.filter(active=True).values_list("gpu_id", flat=True))
    assert all(n == 1 for n in active.values()), active
    for job in Job.objects.filter(state__in=Job.ACTIVE_STATES):
        assert job.allocations.filter(active=True).count() == job.gpus


def test_four_concurrent_passes_never_allocate_a_gpu_twice(
    alice: Any, bob: Any, charlie: Any, cluster: Any, image: Any
) -> None:
    assert connection.vendor == "postgresql"
    for owner in (alice, bob, charlie) * 4:
        submit(owner, gpus=1)
    for owner in (alice, bob):
        submit(owner, gpus=2)
    errors = run_concurrently([scheduling_pass] * 4)
    assert errors == []
    assert_no_gpu_twice()
    assert Allocation.objects.filter(active=True).count() == 8


def test_fifty_concurrent_submits_and_cancels_with_passes_keep_allocations_sound(
    alice: Any, bob: Any, charlie: Any, cluster: Any, image: Any
) -> None:
    owners = [alice, bob, charlie]
    existing = [submit(owners[i % 3], gpus=1 + i % 2) for i in range(25)]

    def submitter(i: int) -> Callable[[], Any]:
        return lambda: submit(owners[i % 3], gpus=1 + i % 3)

    def canceller(job: Job) -> Callable[[], Any]:
        return lambda: job_cancel(job_id=job.pk, actor=job.owner)

    workers: list[Callable[[], Any]] = [submitter(i) for i in range(25)] + [
        canceller(j) for j in existing
    ]
    workers += [scheduling_pass] * 4
    errors = run_concurrently(workers)
    # A cancel may race a pass that just dispatched the job; that is a stop request, not an error.
    assert [e for e in errors if not isinstance(e, Exception)] == []
    unexpected = [f"{type(e).__name__}: {e}" for e in errors if "already ended" not in str(e)]
    assert unexpected == []
    scheduling_pass()
    assert_no_gpu_twice()
    assert Job.objects.count() == 50
    assert (
        Job.objects.filter(pk__in=[j.pk for j in existing], state__in=[*Job.WAITING_STATES]).count()
        == 0
    )

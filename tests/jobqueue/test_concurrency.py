"""On PostgreSQL: concurrent passes and concurrent submit/cancel never allocate a GPU twice."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, connections

from jobqueue.models import Allocation, Job
from jobqueue.services import job_cancel
from scheduling.passes import scheduling_pass
from tests.conftest import run_concurrently
from tests.jobqueue.test_submit import submit

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


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


def test_a_submit_committed_while_a_pass_runs_gets_a_pass_of_its_own(
    alice: Any, cluster: Any, image: Any, sent_tasks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lost wake-up: the submit's request must not be swallowed by the pass already running."""
    import scheduling.passes as scheduling

    submit(alice, gpus=1)  # requests a pass, as the one below
    assert len(sent_tasks.named("control.scheduling_pass")) == 1
    real_load = scheduling.build_engine_input
    late: list[int] = []

    def load_then_someone_submits(now: Any) -> Any:
        state = real_load(now)
        if not late:
            # Another request commits a job after this pass has read the queue.
            def other_request() -> None:
                try:
                    late.append(submit(alice, gpus=1).pk)
                finally:
                    connections.close_all()

            thread = threading.Thread(target=other_request)
            thread.start()
            thread.join(timeout=30)
        return state

    monkeypatch.setattr(scheduling, "build_engine_input", load_then_someone_submits)
    first = scheduling_pass()

    assert late and late[0] not in first.started
    assert len(sent_tasks.named("control.scheduling_pass")) == 2  # the late job's own pass
    second = scheduling_pass()
    assert second.started == late


def test_requests_coalesce_until_a_pass_takes_them(
    alice: Any, cluster: Any, image: Any, sent_tasks: Any
) -> None:
    for _ in range(3):
        submit(alice, gpus=1)
    assert len(sent_tasks.named("control.scheduling_pass")) == 1
    scheduling_pass()
    submit(alice, gpus=1)
    assert len(sent_tasks.named("control.scheduling_pass")) == 2

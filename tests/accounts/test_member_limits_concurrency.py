"""Per-member limits hold when one member's requests arrive at the same moment.

Issue 25 found 20 simultaneous bookings by one member taking 144 GPU-hours against a
48-hour weekly cap, and 100 simultaneous submits leaving 52 jobs waiting against a cap
of 50: each request checked the limit before any other had written its row. Here real
threads, each with its own database connection, send the requests at once, on
PostgreSQL (the PostgreSQL pass) and on SQLite (a file database, as the demo runs).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.db import connection, connections
from django.utils import timezone

from approvals import services as approvals
from core.errors import DomainError
from jobqueue.models import Job, PriorityGrant
from reservations.models import Reservation
from reservations.services import reservation_create, reservation_extend
from tests.conftest import run_concurrently
from tests.factories import GpuFactory, NodeFactory
from tests.jobqueue.test_submit import submit
from tests.reservations.conftest import T0, at

ConcurrentRun = Callable[[list[Callable[[], Any]]], list[BaseException]]

pytestmark = pytest.mark.django_db(transaction=True)


def _file_copy_of_test_database(path: Path) -> Callable[[], None]:
    """SQLite's test database lives in memory, where connections share one cache and never
    wait for each other; the demo's is a file. The committed test data is copied into a file,
    and `connect()` points the calling thread's default connection at it."""
    connection.ensure_connection()
    target = sqlite3.connect(path)
    connection.connection.backup(target)
    target.close()
    file_settings = {**connection.settings_dict, "NAME": str(path)}
    wrapper = type(connections["default"])

    def connect() -> None:
        connections["default"] = wrapper(file_settings, "default")

    return connect


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def at_once(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Any, Any]:
    """(run, read): run workers at once on this database; read what they wrote."""
    if connection.vendor != request.param:
        pytest.skip(f"runs in the {request.param} pass")
    connects: list[Callable[[], None]] = []

    def connect() -> None:
        if connects:
            connects[0]()

    def run(workers: list[Callable[[], Any]]) -> list[BaseException]:
        if connection.vendor == "sqlite" and not connects:
            # The copy holds what the test made until now, committed (transaction=True).
            connects.append(_file_copy_of_test_database(tmp_path / "labportal.sqlite3"))
        return run_concurrently(workers, connect=connect)

    def read(query: Callable[[], Any]) -> Any:
        answer: list[Any] = []
        errors = run_concurrently([lambda: answer.append(query())], connect=connect)
        assert errors == []
        return answer[0]

    return run, read


def only_refusals(errors: list[BaseException]) -> list[BaseException]:
    unexpected = [e for e in errors if not isinstance(e, DomainError)]
    assert unexpected == [], unexpected
    return errors


@pytest.fixture
def four_free_gpus(alice: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """One node of 4 GPUs, free of charge; alice may book 48 GPU-hours a week."""
    monkeypatch.setattr("reservations.services.credit_policy_reservation_rate", lambda: 0)
    alice.category.max_booked_hours_per_week = 48
    alice.category.save()
    node = NodeFactory(name="gpu01")
    return [GpuFactory(node=node, index=i) for i in range(4)]


def test_twenty_bookings_at_once_stay_within_the_weekly_cap(
    alice: Any, four_free_gpus: list[Any], at_once: Any
) -> None:
    run, read = at_once
    gpus = four_free_gpus

    def book(i: int) -> Callable[[], Any]:
        # 8 GPU-hours each, on distinct GPUs and hours of one week: only the cap stops them.
        start = at(1 + 8 * (i // 4))
        return lambda: reservation_create(
            user=alice, gpu_ids=[gpus[i % 4].pk], start=start, end=start + timedelta(hours=8)
        )

    with time_machine.travel(T0, tick=False):
        refusals = only_refusals(run([book(i) for i in range(20)]))

    assert read(lambda: Reservation.objects.filter(user=alice).count()) == 6
    assert len(refusals) == 14
    assert all("GPU-hours" in str(e) for e in refusals)


def test_extensions_at_once_stay_within_the_weekly_cap(
    alice: Any, four_free_gpus: list[Any], at_once: Any
) -> None:
    run, read = at_once
    with time_machine.travel(T0, tick=False):
        # 4 bookings of 4 GPU-hours; each extension adds 10, and only 3 of them fit in 48.
        booked = [
            reservation_create(user=alice, gpu_ids=[gpu.pk], start=at(1), end=at(5))
            for gpu in four_free_gpus
        ]

        def extend(reservation: Reservation) -> Callable[[], Any]:
            return lambda: reservation_extend(
                reservation_id=reservation.pk, actor=alice, new_end=at(15)
            )

        refusals = only_refusals(run([extend(r) for r in booked]))

    assert read(lambda: Reservation.objects.filter(user=alice, end=at(15)).count()) == 3
    assert len(refusals) == 1 and "GPU-hours" in str(refusals[0])


def test_simultaneous_submits_leave_no_more_jobs_waiting_than_the_cap(
    alice: Any, cluster: Any, image: Any, at_once: Any
) -> None:
    run, read = at_once
    alice.category.max_queued_jobs = 5
    alice.category.save()

    refusals = only_refusals(run([lambda: submit(alice, gpus=1)] * 20))

    assert read(lambda: Job.objects.filter(owner=alice).pending().count()) == 5
    assert len(refusals) == 15


def test_simultaneous_grant_requests_leave_one_awaiting_a_decision(
    alice: Any, queues: Any, at_once: Any
) -> None:
    run, read = at_once

    def apply() -> None:
        approvals.grant_apply(
            user=alice,
            reason="Camera-ready experiments for NeurIPS",
            deadline=timezone.now() + timedelta(days=7),
            gpus_expected=2,
        )

    refusals = only_refusals(run([apply] * 8))

    assert read(lambda: PriorityGrant.objects.filter(user=alice).count()) == 1
    assert len(refusals) == 7

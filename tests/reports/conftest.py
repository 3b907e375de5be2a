"""A hand-built week of lab history with known answers (see the numbers in each test).

Week of Monday 2026-03-02; 4 whole GPUs: gpu01 has two A100s, gpu02 two L40S.
  J1 alice normal 2 GPUs (A100s) submitted Mon 00:00, ran 02:00-12:00, completed; 50% busy
  J2 bob   normal 1 GPU (L40S)   submitted Mon 01:00, ran 01:00-05:00, failed;  100% busy
  J3 charlie debug 1 GPU (L40S)  submitted Tue 00:00, ran 06:00-10:00, completed; no telemetry
  J4 alice normal 4 GPUs (all)   submitted Mon 03:00, ran 12:00-14:00, completed; no telemetry
Credits: alice J1 charge 20, refund 2, booking 6; bob J2 charge 4.
Bookings: alice 2 GPUs Thu 10:00-14:00 released at 12:00; bob 1 GPU Fri 09:00-11:00, no-show;
charlie's cancelled booking and a maintenance booking do not count.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest

from accounts.models import CreditAccount, LedgerEntry
from cluster.models import Gpu
from jobqueue.models import Allocation, Job
from reports.periods import period_of
from reservations.models import Reservation
from telemetry.models import GpuSample
from tests.factories import ContainerImageFactory, GpuFactory, NodeFactory, default_queue

UTC = dt.UTC
MONDAY = dt.datetime(2026, 3, 2, tzinfo=UTC)
NOW = dt.datetime(2026, 3, 9, tzinfo=UTC)


def at(day: int, hour: int) -> dt.datetime:
    return MONDAY + dt.timedelta(days=day, hours=hour)


def make_job(
    owner: Any,
    queue: str,
    gpus: list[Gpu],
    submitted: dt.datetime,
    started: dt.datetime,
    ended: dt.datetime,
    state: str,
    **extra: Any,
) -> Job:
    job = Job.objects.create(
        owner=owner,
        queue=default_queue(queue),
        image=ContainerImageFactory.create(),
        command=["python", "train.py"],
        gpus=len(gpus),
        state=state,
        node=gpus[0].node,
        submitted_at=submitted,
        started_at=started,
        ended_at=ended,
        **{"time_limit_s": 86400, **extra},
    )
    for gpu in gpus:
        Allocation.objects.create(
            job=job, gpu=gpu, active=False, allocated_at=started, released_at=ended
        )
    return job


def ledger(user: Any, kind: str, amount: str, key: str, when: dt.datetime, **links: Any) -> None:
    account, _created = CreditAccount.objects.get_or_create(user=user)
    LedgerEntry.objects.create(
        account=account,
        kind=kind,
        amount=Decimal(amount),
        balance_after=Decimal(0),
        idempotency_key=key,
        created_at=when,
        **links,
    )


def book(
    user: Any, gpus: list[Gpu], start: dt.datetime, end: dt.datetime, **extra: Any
) -> Reservation:
    reservation = Reservation.objects.create(user=user, start=start, end=end, **extra)
    reservation.gpus.set(gpus)
    return reservation


@pytest.fixture
def week(queues: Any, alice: Any, bob: Any, charlie: Any) -> dict[str, Any]:
    n1 = NodeFactory.create(name="gpu01")
    n2 = NodeFactory.create(name="gpu02")
    a = [GpuFactory.create(node=n1, index=i, uuid=f"GPU-a{i}", model="A100") for i in range(2)]
    ls = [GpuFactory.create(node=n2, index=i, uuid=f"GPU-l{i}", model="L40S") for i in range(2)]
    j1 = make_job(alice, "normal", a, at(0, 0), at(0, 2), at(0, 12), "completed")
    j2 = make_job(bob, "normal", [ls[0]], at(0, 1), at(0, 1), at(0, 5), "failed")
    j3 = make_job(
        charlie, "debug", [ls[1]], at(1, 0), at(1, 6), at(1, 10), "completed", time_limit_s=3600
    )
    j4 = make_job(alice, "normal", a + ls, at(0, 3), at(0, 12), at(0, 14), "completed")
    for gpu in a:
        GpuSample.objects.create(gpu=gpu, ts=at(0, 3), util_pct=40, job_id=j1.pk)
        GpuSample.objects.create(gpu=gpu, ts=at(0, 4), util_pct=60, job_id=j1.pk)
    GpuSample.objects.create(gpu=ls[0], ts=at(0, 2), util_pct=100, job_id=j2.pk)
    GpuSample.objects.create(gpu=ls[1], ts=at(1, 7), util_pct=None, job_id=j3.pk)
    ledger(alice, "charge", "-20", "c1", at(0, 12), job=j1)
    ledger(alice, "refund", "2", "r1", at(0, 13), job=j1)
    ledger(bob, "charge", "-4", "c2", at(0, 5), job=j2)
    r1 = book(alice, a, at(3, 10), at(3, 12), booked_end=at(3, 14), state="released")
    ledger(alice, "reservation", "-6", "b1", at(3, 9), reservation=r1)
    book(bob, [ls[0]], at(4, 9), at(4, 11), no_show=True, state="completed")
    book(charlie, [ls[1]], at(4, 9), at(4, 11), state="cancelled")
    book(alice, ls, at(5, 0), at(5, 4), is_maintenance=True)
    # Outside the period: never counted.
    make_job(bob, "normal", [ls[0]], at(-3, 0), at(-3, 1), at(-3, 2), "completed")
    return {
        "jobs": [j1, j2, j3, j4],
        "period": period_of("custom", MONDAY.date(), MONDAY.date() + dt.timedelta(days=6)),
    }

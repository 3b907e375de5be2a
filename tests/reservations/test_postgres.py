"""PostgreSQL's exclusion constraint: two live bookings never overlap on one GPU, even in a race."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from reservations import services
from reservations.errors import ReservationConflict
from reservations.models import Reservation, ReservationSlot
from reservations.services import reservation_create
from tests.reservations.conftest import at

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_the_exclusion_constraint_exists_and_refuses_an_overlapping_live_slot(
    alice: Any, bob: Any, gpus: list[Any], contracts: Any, clock: Any
) -> None:
    first = reservation_create(user=alice, gpu_ids=[gpus[0].pk], start=at(1), end=at(3))
    second = Reservation.objects.create(user=bob, start=at(2), end=at(4))
    with pytest.raises(IntegrityError), transaction.atomic():
        ReservationSlot.objects.create(reservation=second, gpu=gpus[0], start=at(2), end=at(4))
    # Touching ends, another GPU, or a slot that is no longer live are all fine.
    ReservationSlot.objects.create(reservation=second, gpu=gpus[1], start=at(2), end=at(4))
    third = Reservation.objects.create(user=bob, start=at(3), end=at(4))
    ReservationSlot.objects.create(reservation=third, gpu=gpus[0], start=at(3), end=at(4))
    ReservationSlot.objects.filter(reservation=first).update(live=False)
    ReservationSlot.objects.filter(reservation=third).delete()
    ReservationSlot.objects.create(reservation=third, gpu=gpus[0], start=at(1), end=at(4))


def test_two_concurrent_bookings_of_one_gpu_exactly_one_wins(
    alice: Any,
    bob: Any,
    gpus: list[Any],
    contracts: Any,
    clock: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Both transactions pass the overlap check before either writes its slot: only the
    # database can stop the second one.
    both_checked = threading.Barrier(2, timeout=20)
    insert_slots = services._insert_slots

    def insert_after_both_checked(reservation: Reservation, gpu_ids: list[int]) -> None:
        both_checked.wait()
        insert_slots(reservation, gpu_ids)

    monkeypatch.setattr(services, "_insert_slots", insert_after_both_checked)
    outcomes: dict[str, Any] = {}

    def book(user: Any, start_h: float, end_h: float) -> None:
        try:
            outcomes[user.username] = reservation_create(
                user=user, gpu_ids=[gpus[0].pk, gpus[1].pk], start=at(start_h), end=at(end_h)
            )
        except ReservationConflict as conflict:
            outcomes[user.username] = conflict
        finally:
            connection.close()

    threads = [
        threading.Thread(target=book, args=(alice, 1, 3)),
        threading.Thread(target=book, args=(bob, 2, 4)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    winners = [o for o in outcomes.values() if isinstance(o, Reservation)]
    losers = [o for o in outcomes.values() if isinstance(o, ReservationConflict)]
    assert len(winners) == 1 and len(losers) == 1, outcomes
    assert Reservation.objects.count() == 1  # the loser's whole transaction rolled back
    assert ReservationSlot.objects.filter(live=True).count() == 2
    # Only the winner was charged.
    assert [e["user"].username for e in contracts.ledger] == [winners[0].user.username]


def test_a_booking_aborted_by_a_deadlock_on_the_slots_is_a_conflict_not_an_error(
    alice: Any, bob: Any, gpus: list[Any], contracts: Any, clock: Any
) -> None:
    # Two writers whose overlapping slots are both uncommitted wait for each other in the
    # exclusion check; PostgreSQL aborts one of them. The booking that started waiting first
    # (alice's, with the default deadlock_timeout) is the one aborted: it lost the race, so
    # alice gets the usual conflict message, not a server error.
    blocker_holds_gpu1 = threading.Event()
    alice_waits = threading.Event()
    outcomes: dict[str, Any] = {}

    def blocker() -> None:
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL deadlock_timeout = '20s'")
                    cursor.execute("SELECT pg_backend_pid()")
                    outcomes["blocker_pid"] = cursor.fetchone()[0]
                other = Reservation.objects.create(user=bob, start=at(1), end=at(3))
                ReservationSlot.objects.create(
                    reservation=other, gpu=gpus[1], start=at(1), end=at(3)
                )
                blocker_holds_gpu1.set()
                alice_waits.wait(20)
                ReservationSlot.objects.create(
                    reservation=other, gpu=gpus[0], start=at(1), end=at(3)
                )
            outcomes["blocker"] = "committed"
        except Exception as error:
            outcomes["blocker"] = error
        finally:
            connection.close()

    def book() -> None:
        blocker_holds_gpu1.wait(20)
        try:
            outcomes["alice"] = reservation_create(
                user=alice, gpu_ids=[gpus[0].pk, gpus[1].pk], start=at(1), end=at(3)
            )
        except Exception as error:
            outcomes["alice"] = error
        finally:
            connection.close()

    threads = [threading.Thread(target=blocker), threading.Thread(target=book)]
    for thread in threads:
        thread.start()
    blocker_holds_gpu1.wait(20)
    # alice's insert has written gpu 0's slot and waits on the blocker's gpu 1 slot.
    for _ in range(400):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND pid <> %s",
                [outcomes["blocker_pid"]],
            )
            if cursor.fetchone()[0]:
                break
        time.sleep(0.05)
    else:
        pytest.fail("alice's booking never waited on the blocker's slot")
    alice_waits.set()
    for thread in threads:
        thread.join(timeout=30)

    assert isinstance(outcomes["alice"], ReservationConflict), outcomes
    assert "a moment ago" in str(outcomes["alice"])
    assert outcomes["blocker"] == "committed", outcomes
    assert list(Reservation.objects.values_list("user__username", flat=True)) == ["bob"]
    assert contracts.ledger == []  # alice was not charged


def test_many_racing_bookings_leave_no_overlap(
    alice: Any, bob: Any, charlie: Any, admin_user: Any, gpus: list[Any], contracts: Any, clock: Any
) -> None:
    users = [alice, bob, charlie, admin_user]
    results: list[Any] = []
    start = threading.Event()

    def book(user: Any, offset: int) -> None:
        start.wait(5)
        try:
            results.append(
                reservation_create(
                    user=user,
                    node=gpus[0].node,
                    gpu_count=3,
                    start=at(1 + offset * 0.5),
                    end=at(3 + offset * 0.5),
                )
            )
        except ReservationConflict as conflict:
            results.append(conflict)
        finally:
            connection.close()

    threads = [threading.Thread(target=book, args=(u, i % 2)) for i, u in enumerate(users)]
    for thread in threads:
        thread.start()
    start.set()
    for thread in threads:
        thread.join(timeout=30)
    slots = list(ReservationSlot.objects.filter(live=True))
    for a in slots:
        for b in slots:
            if a.pk != b.pk and a.gpu_id == b.gpu_id:
                assert a.end <= b.start or b.end <= a.start
    # Three of the four GPUs each, overlapping in time: only one booking fits.
    assert sum(isinstance(r, Reservation) for r in results) == 1
    assert all(s.end - s.start == timedelta(hours=2) for s in slots)

"""Slurm mode books only what Slurm can hold for the member (issue 29 Medium 6): Slurm 22.05
reserves whole nodes and names the unix user who may enter, so a booking of part of a node,
or by a member without a unix login, is refused at once; a booking Slurm never held is
ended and refunded, never charged for nothing."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest

from reservations.errors import BookingNotHonoured
from reservations.models import Reservation
from reservations.services import reservation_create
from slurm.admin_commands import SlurmReservationInfo
from slurm.cli import SlurmError
from slurm.models import UnixLogin
from slurm.reservations import slurm_reservations_sync
from tests.conftest import api_as
from tests.reservations.conftest import T0, at

pytestmark = pytest.mark.django_db


@pytest.fixture
def slurm_mode(settings: Any, contracts: Any, clock: Any) -> Any:
    settings.LABPORTAL_EXECUTOR = "slurm"
    return contracts


def _book(user: Any, gpus: list[Any], **extra: Any) -> Reservation:
    return reservation_create(
        user=user, gpu_ids=[g.pk for g in gpus], start=at(1), end=at(3), **extra
    )


def test_a_booking_of_part_of_a_node_is_refused_with_what_to_book(
    slurm_mode: Any, alice: Any, gpus: list[Any]
) -> None:
    UnixLogin.objects.create(user=alice, username="nobody")
    with pytest.raises(BookingNotHonoured) as refused:
        _book(alice, gpus[:2])
    message = str(refused.value.message)
    assert "Slurm here reserves whole nodes" in message
    assert "cannot keep 2 of the 4 GPUs of gpu01 for you alone" in message
    assert "Book all 4 GPUs of gpu01, or submit a job to a queue instead." in message
    assert not Reservation.objects.exists() and slurm_mode.ledger == []

    whole = _book(alice, gpus[:4])  # the whole of gpu01: Slurm reserves the node
    assert whole.charged == Decimal("16")  # 4 GPUs x 2 h x rate 2


def test_a_member_without_a_unix_login_cannot_book_in_slurm_mode(
    slurm_mode: Any, alice: Any, admin_user: Any, gpus: list[Any]
) -> None:
    with pytest.raises(BookingNotHonoured) as refused:
        _book(alice, gpus[:4])
    assert "no unix user name on the Slurm cluster" in str(refused.value.message)
    assert "admin site → Unix logins" in str(refused.value.message)
    assert slurm_mode.ledger == []
    # Maintenance runs as Slurm's maintenance user: an admin needs no unix login for it.
    assert _book(admin_user, gpus[:4], maintenance=True).is_maintenance


def test_agents_mode_still_books_single_gpus(
    contracts: Any, clock: Any, alice: Any, gpus: list[Any]
) -> None:
    assert _book(alice, gpus[:1]).gpus.count() == 1


def test_the_api_answers_a_refused_booking_with_a_400_that_says_why(
    slurm_mode: Any, alice: Any, gpus: list[Any]
) -> None:
    UnixLogin.objects.create(user=alice, username="nobody")
    response = api_as(alice).post(
        "/api/v1/reservations/",
        {"gpus": [gpus[0].pk], "start": at(1).isoformat(), "end": at(3).isoformat()},
        format="json",
    )
    assert response.status_code == 400, response.content
    assert b"booking_not_honoured" in response.content
    assert b"reserves whole nodes" in response.content


class NoReservations:
    """A Slurm that holds no portal reservation and refuses to make one."""

    def reservations(self) -> list[SlurmReservationInfo]:
        return []

    def scontrol(self, *args: str) -> str:
        if args[:2] == ("show", "node"):
            return "NodeName=gpu01 CPUTot=16 Gres=gpu:4 ThreadsPerCore=1\n"
        if args[0] == "create":
            raise SlurmError("Requested nodes are busy")
        raise AssertionError(f"unexpected scontrol {args}")


def test_a_booking_slurm_never_held_is_refunded_once_well_after_its_start(
    slurm_mode: Any, alice: Any, gpus: list[Any], clock: Any
) -> None:
    # Booked (and charged) before the member's unix login was removed.
    login = UnixLogin.objects.create(user=alice, username="nobody")
    booking = _book(alice, gpus[:4])
    login.delete()

    clock.move_to(at(1) + timedelta(minutes=5))  # 5 min in: maybe a short outage
    slurm_reservations_sync(admin=NoReservations())  # type: ignore[arg-type]
    booking.refresh_from_db()
    assert booking.state != Reservation.State.CANCELLED
    assert booking.slurm_reservation.error == "no unix login for the member"

    clock.move_to(at(1) + timedelta(minutes=11))
    slurm_reservations_sync(admin=NoReservations())  # type: ignore[arg-type]
    slurm_reservations_sync(admin=NoReservations())  # type: ignore[arg-type]
    booking.refresh_from_db()
    assert booking.state == Reservation.State.CANCELLED and booking.charged == 0
    refunds = [e for e in slurm_mode.ledger if e["kind"] == "refund"]
    assert [e["amount"] for e in refunds] == [Decimal("16")]  # once, all of it
    (told,) = [n for n in slurm_mode.notifications if n["kind"] == "reservation_unhonoured"]
    assert "no unix login for the member" in str(told["body"])
    assert "refunded" in str(told["body"])


def test_a_maintenance_window_slurm_did_not_hold_is_not_cancelled(
    slurm_mode: Any, admin_user: Any, gpus: list[Any], clock: Any, settings: Any
) -> None:
    booking = _book(admin_user, gpus[:4], maintenance=True)
    clock.move_to(at(1) + timedelta(minutes=30))
    slurm_reservations_sync(admin=NoReservations())  # type: ignore[arg-type]
    booking.refresh_from_db()
    assert booking.state != Reservation.State.CANCELLED
    assert booking.start > T0
    assert booking.slurm_reservation.error == "Requested nodes are busy"  # shown to admins


def test_a_booking_slurm_refused_to_reserve_is_refunded_too(
    slurm_mode: Any, alice: Any, gpus: list[Any], clock: Any
) -> None:
    UnixLogin.objects.create(user=alice, username="nobody")
    booking = _book(alice, gpus[:4])
    clock.move_to(at(1) + timedelta(minutes=15))
    slurm_reservations_sync(admin=NoReservations())  # type: ignore[arg-type]
    booking.refresh_from_db()
    assert booking.state == Reservation.State.CANCELLED and booking.charged == 0
    (told,) = [n for n in slurm_mode.notifications if n["kind"] == "reservation_unhonoured"]
    assert "Requested nodes are busy" in str(told["body"])

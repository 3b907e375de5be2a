"""Slot boundaries driven by the beat tick, with travelled time."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from reservations.models import BookingRule, Reservation, ReservationSlot
from reservations.services import reservation_create, reservations_tick
from reservations.tasks import reservations_tick as reservations_tick_task
from tests.reservations.conftest import at
from tests.reservations.factories import running_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def booking(alice: Any, gpus: list[Any], contracts: Any, clock: Any) -> Reservation:
    return reservation_create(user=alice, gpu_ids=[gpus[0].pk, gpus[1].pk], start=at(1), end=at(3))


def test_nothing_happens_before_the_start(booking: Reservation, clock: Any, contracts: Any) -> None:
    clock.move_to(at(1) - timedelta(seconds=1))
    assert reservations_tick() == {"ended": 0, "started": 0, "warned": 0, "no_shows": 0}
    booking.refresh_from_db()
    assert booking.state == Reservation.State.BOOKED


def test_at_the_start_it_becomes_active_and_the_owner_is_told_once(
    booking: Reservation, alice: Any, clock: Any, contracts: Any
) -> None:
    clock.move_to(at(1))
    assert reservations_tick()["started"] == 1
    assert reservations_tick()["started"] == 0  # the broker may deliver the tick twice
    booking.refresh_from_db()
    assert booking.state == Reservation.State.ACTIVE
    assert booking.activated_at == at(1)
    assert contracts.kinds_for(alice) == ["reservation_started"]


def test_the_beat_task_runs_the_tick(booking: Reservation, clock: Any) -> None:
    clock.move_to(at(1) + timedelta(seconds=20))
    assert reservations_tick_task.apply().get()["started"] == 1


def test_before_the_end_the_owner_is_warned_about_jobs_still_running(
    booking: Reservation, alice: Any, gpus: list[Any], clock: Any, contracts: Any
) -> None:
    clock.move_to(at(1))
    reservations_tick()
    job = running_job(owner=alice, gpus=gpus[:2], reservation=booking, time_limit_s=4 * 3600)
    clock.move_to(at(3) - timedelta(minutes=20))
    assert reservations_tick()["warned"] == 0
    clock.move_to(at(3) - timedelta(minutes=15))
    assert reservations_tick()["warned"] == 1
    assert reservations_tick()["warned"] == 0
    ending = [n for n in contracts.notifications if n["kind"] == "reservation_ending"]
    assert len(ending) == 1 and f"#{job.pk}" in ending[0]["body"]


def test_no_warning_when_nothing_runs_in_the_slot(
    booking: Reservation, alice: Any, clock: Any, contracts: Any
) -> None:
    clock.move_to(at(1))
    reservations_tick()
    clock.move_to(at(3) - timedelta(minutes=5))
    reservations_tick()
    assert "reservation_ending" not in contracts.kinds_for(alice)


def test_at_the_end_it_completes_and_warn_only_leaves_jobs_running(
    booking: Reservation, alice: Any, gpus: list[Any], clock: Any, contracts: Any
) -> None:
    clock.move_to(at(1))
    reservations_tick()
    running_job(owner=alice, gpus=gpus[:2], reservation=booking, time_limit_s=4 * 3600)
    clock.move_to(at(3))
    assert reservations_tick()["ended"] == 1
    assert reservations_tick()["ended"] == 0
    booking.refresh_from_db()
    assert booking.state == Reservation.State.COMPLETED
    assert not ReservationSlot.objects.filter(reservation=booking, live=True).exists()
    assert contracts.stops == []
    assert "reservation_ended" in contracts.kinds_for(alice)


def test_at_the_end_stop_policy_stops_the_jobs_in_the_slot(
    booking: Reservation, alice: Any, bob: Any, gpus: list[Any], clock: Any, contracts: Any
) -> None:
    BookingRule.objects.create(category=alice.category, end_policy=BookingRule.EndPolicy.STOP)
    clock.move_to(at(1))
    reservations_tick()
    in_slot = running_job(owner=alice, gpus=gpus[:2], reservation=booking, time_limit_s=4 * 3600)
    elsewhere = running_job(owner=alice, gpus=gpus[2:3], time_limit_s=4 * 3600)
    clock.move_to(at(3) + timedelta(seconds=10))
    reservations_tick()
    reservations_tick()
    assert [s["job_id"] for s in contracts.stops] == [in_slot.pk]
    assert elsewhere.pk not in [s["job_id"] for s in contracts.stops]


def test_a_missed_start_goes_straight_to_completed(booking: Reservation, clock: Any) -> None:
    clock.move_to(at(4))
    result = reservations_tick()
    assert result["ended"] == 1 and result["started"] == 0
    booking.refresh_from_db()
    assert booking.state == Reservation.State.COMPLETED


class TestNoShow:
    def test_an_unused_slot_is_a_no_show_the_charge_stands_and_the_owner_is_told(
        self, booking: Reservation, alice: Any, clock: Any, contracts: Any
    ) -> None:
        clock.move_to(at(1))
        reservations_tick()
        clock.move_to(at(1) + timedelta(minutes=14))
        assert reservations_tick()["no_shows"] == 0
        clock.move_to(at(1) + timedelta(minutes=15))
        assert reservations_tick()["no_shows"] == 1
        assert reservations_tick()["no_shows"] == 0
        booking.refresh_from_db()
        assert booking.no_show
        assert "reservation_no_show" in contracts.kinds_for(alice)
        assert [e["kind"] for e in contracts.ledger] == ["reservation"]  # no refund
        assert contracts.balance_change(alice) == -booking.charged
        assert booking.state == Reservation.State.ACTIVE  # not released: it stays hers

    @pytest.mark.parametrize(
        ("language", "kept", "released"),
        [
            ("en", "stays yours and stays charged", "released and you are told"),
            ("zh-hans", "预约仍归你所有并照常按时段收费", "它会被释放"),
        ],
    )
    def test_the_manual_says_what_a_no_show_does(
        self, language: str, kept: str, released: str
    ) -> None:
        """One behaviour, stated once: the booking stays the owner's and charged (the
        notification says so too); the manual once said it was released."""
        from handbook.manual import PAGES_BY_SLUG

        text = PAGES_BY_SLUG["booking"].source(language).read_text()
        assert kept in text.replace("\n", " ") or kept in text.replace("\n", "")
        assert released not in text

    def test_a_job_of_the_owner_on_the_gpus_is_not_a_no_show(
        self, booking: Reservation, alice: Any, gpus: list[Any], clock: Any, contracts: Any
    ) -> None:
        clock.move_to(at(1) + timedelta(minutes=5))
        reservations_tick()
        running_job(owner=alice, gpus=gpus[:1])
        clock.move_to(at(1) + timedelta(minutes=30))
        reservations_tick()
        booking.refresh_from_db()
        assert not booking.no_show
        assert "reservation_no_show" not in contracts.kinds_for(alice)

    def test_gpu_use_in_telemetry_is_not_a_no_show(
        self, booking: Reservation, alice: Any, gpus: list[Any], clock: Any
    ) -> None:
        from telemetry.models import GpuSample

        clock.move_to(at(1))
        reservations_tick()
        GpuSample.objects.create(gpu=gpus[1], ts=at(1) + timedelta(minutes=3), util_pct=87.0)
        clock.move_to(at(1) + timedelta(minutes=20))
        reservations_tick()
        booking.refresh_from_db()
        assert not booking.no_show

    def test_someone_elses_job_does_not_count_as_use(
        self, booking: Reservation, bob: Any, gpus: list[Any], clock: Any
    ) -> None:
        clock.move_to(at(1))
        reservations_tick()
        running_job(owner=bob, gpus=gpus[:1])
        clock.move_to(at(1) + timedelta(minutes=20))
        reservations_tick()
        booking.refresh_from_db()
        assert booking.no_show

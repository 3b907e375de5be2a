from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest

from cluster.models import Gpu, Node
from reservations.errors import (
    BookingRuleViolation,
    GpuNotBookable,
    NotAllowed,
    ReservationConflict,
    ReservationStateError,
)
from reservations.models import BookingRule, Reservation, ReservationSlot
from reservations.services import (
    reservation_cancel,
    reservation_create,
    reservation_extend,
    reservation_release_early,
)
from tests.reservations.conftest import T0, at

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _setup(contracts: Any, clock: Any) -> None:
    pass


def book(user: Any, gpus: list[Any], start: float, end: float, **kwargs: Any) -> Reservation:
    return reservation_create(
        user=user, gpu_ids=[g.pk for g in gpus], start=at(start), end=at(end), **kwargs
    )


def test_a_member_books_two_gpus_and_is_charged_their_gpu_hours(
    alice: Any, gpus: list[Any], contracts: Any
) -> None:
    reservation = book(alice, gpus[:2], 1, 4, note="training run")
    assert reservation.state == Reservation.State.BOOKED
    assert set(reservation.gpus.all()) == set(gpus[:2])
    assert ReservationSlot.objects.filter(reservation=reservation, live=True).count() == 2
    # 2 GPUs x 3 hours x rate 2
    assert contracts.ledger == [
        {
            "user": alice,
            "amount": Decimal("-12.0000"),
            "kind": "reservation",
            "idempotency_key": f"reservation:{reservation.pk}:book",
            "reservation": reservation,
            # The note is a msgid with its parameters: it reads in each reader's language.
            "note": "Booking of %(count)d GPUs, %(start)s – %(end)s",
            "note_params": contracts.ledger[0]["note_params"],
            "created_by": alice,
        }
    ]
    assert reservation.charged == Decimal("12")


def test_it_books_n_gpus_on_a_node_choosing_free_ones(
    alice: Any, bob: Any, gpus: list[Any]
) -> None:
    book(bob, gpus[:1], 1, 3)
    reservation = reservation_create(
        user=alice, node=gpus[0].node, gpu_count=2, start=at(1), end=at(3)
    )
    assert sorted(g.index for g in reservation.gpus.all()) == [1, 2]


def test_it_rejects_overlapping_booking_and_offers_the_nearest_free_slot(
    alice: Any, bob: Any, gpus: list[Any]
) -> None:
    book(bob, gpus[:1], 1, 3)
    with pytest.raises(ReservationConflict) as refused:
        book(alice, gpus[:1], 2, 4)
    assert refused.value.suggestion is not None
    assert refused.value.suggestion.start == at(3)
    assert refused.value.suggestion.gpu_ids == (gpus[0].pk,)
    assert "nearest free slot" in str(refused.value.message)


def test_it_refuses_too_many_gpus_on_a_node_and_suggests_later(
    alice: Any, bob: Any, gpus: list[Any]
) -> None:
    book(bob, gpus[:3], 1, 3)
    with pytest.raises(ReservationConflict) as refused:
        reservation_create(user=alice, node=gpus[0].node, gpu_count=2, start=at(1), end=at(2))
    assert refused.value.suggestion is not None
    assert refused.value.suggestion.start == at(3)


def test_back_to_back_bookings_do_not_overlap(alice: Any, bob: Any, gpus: list[Any]) -> None:
    book(bob, gpus[:1], 1, 3)
    assert book(alice, gpus[:1], 3, 4).pk


def test_a_cancelled_booking_frees_its_gpus(alice: Any, bob: Any, gpus: list[Any]) -> None:
    theirs = book(bob, gpus[:1], 1, 3)
    reservation_cancel(reservation_id=theirs.pk, actor=bob)
    assert book(alice, gpus[:1], 1, 3).pk


def test_it_refuses_gpus_on_a_node_that_is_not_up(alice: Any, gpus: list[Any]) -> None:
    Node.objects.filter(pk=gpus[0].node_id).update(state=Node.State.DRAINING)
    with pytest.raises(GpuNotBookable):
        book(alice, gpus[:1], 1, 2)


def test_it_refuses_a_disabled_gpu_and_partitions(alice: Any, gpus: list[Any]) -> None:
    Gpu.objects.filter(pk=gpus[0].pk).update(state=Gpu.State.DISABLED)
    with pytest.raises(GpuNotBookable):
        book(alice, gpus[:1], 1, 2)
    mig = Gpu.objects.create(
        node=gpus[1].node,
        index=1,
        uuid="MIG-x",
        model="m",
        memory_mb=1,
        kind=Gpu.Kind.MIG,
        parent=gpus[1],
    )
    with pytest.raises(GpuNotBookable):
        reservation_create(user=alice, gpu_ids=[mig.pk], start=at(1), end=at(2))


class TestCategoryRules:
    def test_it_enforces_max_gpus_per_booking(self, alice: Any, gpus: list[Any]) -> None:
        BookingRule.objects.create(category=alice.category, max_gpus_per_booking=2)
        with pytest.raises(BookingRuleViolation, match="at most 2 GPUs"):
            book(alice, gpus[:3], 1, 2)
        assert book(alice, gpus[:2], 1, 2).pk

    def test_it_enforces_the_minimum_length(self, alice: Any, gpus: list[Any]) -> None:
        BookingRule.objects.create(
            category=alice.category, min_length_minutes=60, granularity_minutes=30
        )
        with pytest.raises(BookingRuleViolation, match="at least 60 minutes"):
            book(alice, gpus[:1], 1, 1.5)

    def test_it_enforces_the_maximum_length(self, alice: Any, gpus: list[Any]) -> None:
        BookingRule.objects.create(category=alice.category, max_length_hours=4)
        with pytest.raises(BookingRuleViolation, match="at most 4 hours"):
            book(alice, gpus[:1], 1, 6)
        assert book(alice, gpus[:1], 1, 5).pk

    def test_it_enforces_the_slot_granularity(self, alice: Any, gpus: list[Any]) -> None:
        BookingRule.objects.create(category=alice.category, granularity_minutes=60)
        with pytest.raises(BookingRuleViolation, match="60-minute grid"):
            book(alice, gpus[:1], 1.5, 3)
        with pytest.raises(BookingRuleViolation, match="60-minute grid"):
            reservation_create(
                user=alice, gpu_ids=[gpus[0].pk], start=at(1) + timedelta(minutes=1), end=at(3)
            )

    def test_it_enforces_how_far_ahead(self, alice: Any, gpus: list[Any]) -> None:
        alice.category.max_booking_days_ahead = 2
        alice.category.save()
        with pytest.raises(BookingRuleViolation, match="at most 2 days ahead"):
            book(alice, gpus[:1], 48, 49.5)
        assert book(alice, gpus[:1], 46, 47).pk

    def test_it_enforces_the_weekly_gpu_hours(self, alice: Any, gpus: list[Any]) -> None:
        alice.category.max_booked_hours_per_week = 10
        alice.category.save()
        book(alice, gpus[:2], 1, 5)  # 8 GPU-hours
        with pytest.raises(BookingRuleViolation, match="8 of your 10 GPU-hours"):
            book(alice, gpus[:2], 6, 8)  # 4 more
        assert book(alice, gpus[:2], 6, 7).pk  # exactly 10

    def test_the_weekly_cap_counts_each_week_separately(self, alice: Any, gpus: list[Any]) -> None:
        alice.category.max_booked_hours_per_week = 10
        alice.category.max_booking_days_ahead = 14
        alice.category.save()
        book(alice, gpus[:1], 1, 11)  # 10 hours this week
        assert book(alice, gpus[:1], 7 * 24, 7 * 24 + 10).pk  # next Monday

    def test_cancelled_bookings_do_not_count_towards_the_weekly_cap(
        self, alice: Any, gpus: list[Any]
    ) -> None:
        alice.category.max_booked_hours_per_week = 4
        alice.category.save()
        first = book(alice, gpus[:1], 1, 5)
        reservation_cancel(reservation_id=first.pk, actor=alice)
        assert book(alice, gpus[:1], 1, 5).pk

    def test_a_member_without_a_category_gets_the_defaults(self, gpus: list[Any]) -> None:
        from tests.factories import UserFactory

        loner = UserFactory(username="loner")
        with pytest.raises(BookingRuleViolation, match="at most 4 GPUs"):
            book(
                loner,
                gpus[:5] if gpus[4].node_id == gpus[0].node_id else gpus[:4] + gpus[4:5],
                1,
                2,
            )

    def test_admins_book_over_the_rules_and_may_mark_maintenance(
        self, admin_user: Any, gpus: list[Any], contracts: Any
    ) -> None:
        reservation = book(admin_user, gpus, 1.25, 60, maintenance=True)
        assert reservation.is_maintenance
        assert contracts.ledger == []  # maintenance is free

    def test_admins_may_not_book_from_long_ago_or_more_than_a_year_ahead(
        self, admin_user: Any, gpus: list[Any], contracts: Any
    ) -> None:
        with pytest.raises(BookingRuleViolation, match="more than a day in the past"):
            book(admin_user, gpus[:1], -25, 1)
        with pytest.raises(BookingRuleViolation, match="more than a year ahead"):
            book(admin_user, gpus[:1], 1, 367 * 24)
        assert contracts.ledger == [] and not Reservation.objects.exists()

    def test_an_admin_booking_that_started_earlier_is_charged_from_now_and_released_to_zero(
        self, admin_user: Any, gpus: list[Any], contracts: Any
    ) -> None:
        reservation = book(admin_user, gpus[:1], -10, 2)
        # 1 GPU x the 2 hours from now on x rate 2: the 10 hours already past are free.
        assert reservation.charged == Decimal("4")
        reservation_release_early(reservation_id=reservation.pk, actor=admin_user)
        reservation.refresh_from_db()
        assert reservation.charged < Decimal("4")
        assert sum(entry["amount"] for entry in contracts.ledger) == -reservation.charged

    def test_members_may_not_mark_maintenance(self, alice: Any, gpus: list[Any]) -> None:
        with pytest.raises(NotAllowed):
            book(alice, gpus[:1], 1, 2, maintenance=True)

    def test_it_refuses_a_start_in_the_past(self, alice: Any, gpus: list[Any]) -> None:
        with pytest.raises(BookingRuleViolation, match="in the past"):
            book(alice, gpus[:1], -2, 1)


class TestCredits:
    def test_cancelling_before_the_start_refunds_everything(
        self, alice: Any, gpus: list[Any], contracts: Any
    ) -> None:
        reservation = book(alice, gpus[:2], 1, 4)
        reservation_cancel(reservation_id=reservation.pk, actor=alice)
        reservation_cancel(reservation_id=reservation.pk, actor=alice)  # twice is harmless
        assert contracts.balance_change(alice) == 0
        assert [e["kind"] for e in contracts.ledger] == ["reservation", "refund"]
        reservation.refresh_from_db()
        assert reservation.state == Reservation.State.CANCELLED
        assert not reservation.slots.filter(live=True).exists()

    def test_it_refuses_to_cancel_a_started_booking(
        self, alice: Any, gpus: list[Any], clock: Any
    ) -> None:
        reservation = book(alice, gpus[:1], 1, 4)
        clock.move_to(at(2))
        with pytest.raises(ReservationStateError, match="release it early"):
            reservation_cancel(reservation_id=reservation.pk, actor=alice)

    def test_releasing_early_refunds_the_unused_time_from_the_next_boundary(
        self, alice: Any, gpus: list[Any], contracts: Any, clock: Any
    ) -> None:
        reservation = book(alice, gpus[:2], 1, 5)  # 8 GPU-hours, 16 credits
        clock.move_to(at(2) + timedelta(minutes=10))
        reservation_release_early(reservation_id=reservation.pk, actor=alice)
        reservation.refresh_from_db()
        assert reservation.state == Reservation.State.RELEASED
        assert reservation.end == at(2.5)
        assert reservation.booked_end == at(5)
        # 2 GPUs x 2.5 hours x 2 credits refunded
        assert contracts.ledger[-1]["amount"] == Decimal("10.0000")
        assert (
            contracts.ledger[-1]["idempotency_key"]
            == f"reservation:{reservation.pk}:refund:release"
        )
        assert contracts.balance_change(alice) == Decimal("-6")
        assert reservation.charged == Decimal("6")
        # the GPUs are free for others right away
        assert not reservation.slots.filter(live=True).exists()

    def test_releasing_twice_refunds_once(
        self, alice: Any, gpus: list[Any], contracts: Any, clock: Any
    ) -> None:
        reservation = book(alice, gpus[:1], 1, 5)
        clock.move_to(at(2))
        reservation_release_early(reservation_id=reservation.pk, actor=alice)
        reservation_release_early(reservation_id=reservation.pk, actor=alice)
        assert [e["kind"] for e in contracts.ledger] == ["reservation", "refund"]

    def test_releasing_a_future_booking_cancels_it(
        self, alice: Any, gpus: list[Any], contracts: Any
    ) -> None:
        reservation = book(alice, gpus[:1], 1, 5)
        reservation_release_early(reservation_id=reservation.pk, actor=alice)
        reservation.refresh_from_db()
        assert reservation.state == Reservation.State.CANCELLED
        assert contracts.balance_change(alice) == 0

    def test_extending_charges_the_extra_time(
        self, alice: Any, gpus: list[Any], contracts: Any
    ) -> None:
        reservation = book(alice, gpus[:2], 1, 3)
        reservation_extend(reservation_id=reservation.pk, actor=alice, new_end=at(4))
        reservation.refresh_from_db()
        assert reservation.end == at(4)
        assert set(reservation.slots.values_list("end", flat=True)) == {at(4)}
        assert contracts.ledger[-1]["amount"] == Decimal("-4.0000")
        assert contracts.balance_change(alice) == Decimal("-12")

    def test_extending_into_someone_elses_booking_says_until_when(
        self, alice: Any, bob: Any, gpus: list[Any]
    ) -> None:
        reservation = book(alice, gpus[:1], 1, 3)
        book(bob, gpus[:1], 4, 5)
        with pytest.raises(ReservationConflict, match="extend until then"):
            reservation_extend(reservation_id=reservation.pk, actor=alice, new_end=at(5))
        assert reservation_extend(
            reservation_id=reservation.pk, actor=alice, new_end=at(4)
        ).end == at(4)

    def test_extending_respects_the_maximum_length_and_weekly_cap(
        self, alice: Any, gpus: list[Any]
    ) -> None:
        BookingRule.objects.create(category=alice.category, max_length_hours=3)
        reservation = book(alice, gpus[:1], 1, 3)
        with pytest.raises(BookingRuleViolation, match="at most 3 hours"):
            reservation_extend(reservation_id=reservation.pk, actor=alice, new_end=at(5))
        alice.category.max_booked_hours_per_week = 2
        alice.category.save()
        with pytest.raises(BookingRuleViolation, match="GPU-hours"):
            reservation_extend(reservation_id=reservation.pk, actor=alice, new_end=at(4))


class TestPermissions:
    def test_bob_and_charlie_cannot_change_alices_booking(
        self, alice: Any, bob: Any, charlie: Any, gpus: list[Any]
    ) -> None:
        reservation = book(alice, gpus[:1], 1, 3)
        for outsider in (bob, charlie):
            with pytest.raises(NotAllowed):
                reservation_cancel(reservation_id=reservation.pk, actor=outsider)
            with pytest.raises(NotAllowed):
                reservation_extend(reservation_id=reservation.pk, actor=outsider, new_end=at(4))
            with pytest.raises(NotAllowed):
                reservation_release_early(reservation_id=reservation.pk, actor=outsider)

    def test_an_admin_can_cancel_anyones_booking(
        self, alice: Any, admin_user: Any, gpus: list[Any]
    ) -> None:
        reservation = book(alice, gpus[:1], 1, 3)
        assert (
            reservation_cancel(reservation_id=reservation.pk, actor=admin_user).state
            == Reservation.State.CANCELLED
        )


def test_the_clock_fixture_is_a_monday() -> None:
    assert T0.weekday() == 0


class TestWithTheRealLedger:
    """The same flows against accounts' real ledger_post and notify (no recording)."""

    @pytest.fixture(autouse=True)
    def _real_contracts(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import accounts.services
        from accounts.models import CreditPolicy

        monkeypatch.undo()  # drop the recording fakes of the module-level fixture
        policy = CreditPolicy.current()
        policy.reservation_rate = Decimal("1.5")
        policy.save()
        assert callable(accounts.services.ledger_post)

    def test_booking_cancelling_and_releasing_move_the_balance(
        self, alice: Any, gpus: list[Any], clock: Any
    ) -> None:
        from accounts.models import LedgerEntry
        from accounts.selectors import balance_of

        first = book(alice, gpus[:2], 1, 3)  # 4 GPU-hours x 1.5
        assert balance_of(alice) == Decimal("-6")
        reservation_cancel(reservation_id=first.pk, actor=alice)
        assert balance_of(alice) == 0
        second = book(alice, gpus[:1], 1, 5)
        clock.move_to(at(1) + timedelta(minutes=20))
        reservation_release_early(reservation_id=second.pk, actor=alice)
        # charged 4 x 1.5; used until 10:30 (the next grid step), so 3.5 hours x 1.5 come back
        assert balance_of(alice) == Decimal("-0.75")
        assert LedgerEntry.objects.filter(reservation=second).count() == 2

    def test_the_start_and_a_no_show_reach_the_bell(
        self, alice: Any, gpus: list[Any], clock: Any
    ) -> None:
        from accounts.models import CreditPolicy, Notification
        from reservations.services import reservations_tick

        CreditPolicy.objects.filter(pk=1).update(no_show_window_minutes=20)
        booking = book(alice, gpus[:1], 1, 3)
        clock.move_to(at(1))
        reservations_tick()
        clock.move_to(at(1) + timedelta(minutes=20))
        reservations_tick()
        reservations_tick()
        kinds = list(
            Notification.objects.filter(user=alice).values_list("kind", flat=True).order_by("pk")
        )
        assert kinds.count("reservation_started") == 1 and kinds.count("reservation_no_show") == 1
        booking.refresh_from_db()
        assert booking.no_show

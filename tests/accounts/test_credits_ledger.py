"""The ledger: append-only, idempotent, and its balance always equals the sum of its entries."""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any

import pytest
from django.core import mail
from django.db import connection

from accounts.errors import InvalidAmount, UnknownLedgerKind
from accounts.models import CreditAccount, CreditPolicy, LedgerEntry, Notification
from accounts.services import ledger_post

pytestmark = pytest.mark.django_db


def post(user: Any, amount: str, key: str, kind: str = "adjustment") -> LedgerEntry:
    return ledger_post(user=user, amount=Decimal(amount), kind=kind, idempotency_key=key)


def test_a_posting_moves_the_balance_and_records_the_balance_after(alice: Any) -> None:
    post(alice, "100", "k1", "grant")
    entry = post(alice, "-30.5", "k2", "charge")
    alice.refresh_from_db()
    assert alice.credit_account.balance == Decimal("69.500")
    assert entry.balance_after == Decimal("69.500")


def test_the_same_idempotency_key_posts_once_and_returns_the_first_entry(alice: Any) -> None:
    first = post(alice, "-10", "charge:job:1:window:1", "charge")
    second = post(alice, "-10", "charge:job:1:window:1", "charge")
    assert first.pk == second.pk
    assert LedgerEntry.objects.count() == 1
    assert CreditAccount.objects.get(user=alice).balance == Decimal("-10")


def test_entries_cannot_be_changed_or_deleted(alice: Any) -> None:
    entry = post(alice, "5", "k")
    entry.amount = Decimal("500")
    with pytest.raises(ValueError):
        entry.save()
    with pytest.raises(ValueError):
        entry.delete()


def test_it_refuses_unknown_kinds_and_float_amounts_with_a_clear_message(alice: Any) -> None:
    with pytest.raises(UnknownLedgerKind, match="use one of"):
        ledger_post(user=alice, amount=Decimal("1"), kind="bonus", idempotency_key="x")
    with pytest.raises(InvalidAmount, match="Decimal"):
        ledger_post(user=alice, amount=1.5, kind="adjustment", idempotency_key="y")  # type: ignore[arg-type]


def test_the_balance_equals_the_sum_of_entries_after_many_postings(alice: Any, bob: Any) -> None:
    for i in range(20):
        post(alice if i % 2 else bob, str(7 - i), f"k{i}")
    assert not CreditAccount.objects.inconsistent().exists()


def test_the_invariant_check_finds_a_tampered_balance(alice: Any) -> None:
    post(alice, "10", "k")
    CreditAccount.objects.filter(user=alice).update(balance=Decimal("11"))
    assert list(CreditAccount.objects.inconsistent().values_list("user__username", flat=True)) == [
        "alice"
    ]


def test_crossing_to_zero_tells_the_member_that_jobs_still_run_and_when_the_next_grant_comes(
    alice: Any, django_capture_on_commit_callbacks: Any
) -> None:
    post(alice, "50", "grant", "grant")
    with django_capture_on_commit_callbacks(execute=True):
        post(alice, "-60", "charge", "charge")
    note = Notification.objects.get(user=alice, kind="credits_zero")
    assert "keep running" in note.body
    assert "next grant" in note.body
    assert mail.outbox and mail.outbox[0].to == ["alice@lab.example"]


def test_falling_to_the_low_threshold_warns_once_per_crossing(alice: Any) -> None:
    CreditPolicy.objects.update_or_create(pk=1, defaults={"low_credit_threshold": Decimal("100")})
    post(alice, "500", "grant", "grant")
    post(alice, "-450", "c1", "charge")
    post(alice, "-10", "c2", "charge")
    assert Notification.objects.filter(user=alice, kind="credits_low").count() == 1
    assert not Notification.objects.filter(user=alice, kind="credits_zero").exists()


def test_members_at_or_below_zero_are_listed_without_credit(
    alice: Any, bob: Any, charlie: Any
) -> None:
    post(alice, "10", "a", "grant")
    post(bob, "-1", "b", "charge")
    from django.utils import timezone

    from scheduling.passes import build_engine_input

    state, _policy, _gpus = build_engine_input(timezone.now())
    assert state.users_without_credit == frozenset({"bob", "charlie"})


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_charges_keep_the_balance_equal_to_the_sum_of_entries(alice: Any) -> None:
    post(alice, "1000", "grant", "grant")
    # With what alice had before (her first month's grant when she joined).
    start = CreditAccount.objects.get(user=alice).balance
    errors: list[BaseException] = []

    def charge(worker: int) -> None:
        try:
            for i in range(15):
                # Every charge is also delivered twice, by different threads.
                for _copy in range(2):
                    post(alice, "-1.5", f"charge:{(worker + _copy) % 8}:{i}", "charge")
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=charge, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    account = CreditAccount.objects.get(user=alice)
    assert LedgerEntry.objects.filter(kind="charge").count() == 8 * 15
    assert account.balance == start - Decimal("1.5") * 8 * 15
    assert not CreditAccount.objects.inconsistent().exists()
    balances_after = sorted(LedgerEntry.objects.values_list("balance_after", flat=True))
    assert len(set(balances_after)) == len(balances_after)

"""A new member's first credits come at once: created approved (by an admin, a campus
sign-in, an open sign-up) or approved later, they get this month's grant when that commits,
not at the next hourly pass (until which a Slurm member at zero credit would be niced)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from accounts.models import CreditAccount, CreditPolicy, LedgerEntry, User
from accounts.services import credits_monthly_grant
from tests.conftest import api_as

pytestmark = pytest.mark.django_db


def grants(user: User) -> list[LedgerEntry]:
    return list(LedgerEntry.objects.filter(account__user=user, kind=LedgerEntry.Kind.GRANT))


def test_a_member_created_approved_has_this_months_grant_at_once(
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        erin = User.objects.create_user("erin", "erin@lab.example")
    expected = CreditPolicy.current().grant_for(erin)
    assert expected > 0
    (grant,) = grants(erin)
    assert grant.amount == expected
    assert CreditAccount.objects.get(user=erin).balance == expected
    summary = api_as(erin).get("/api/credits/").json()
    assert float(summary["balance"]) == float(expected)
    # The hourly pass then grants nobody twice.
    credits_monthly_grant()
    assert len(grants(erin)) == 1


def test_a_pending_sign_up_gets_its_grant_when_an_admin_approves_it(
    admin_user: Any, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        dana = User.objects.create_user(
            "dana", "dana@lab.example", approval=User.Approval.PENDING, is_active=False
        )
    assert grants(dana) == []
    client = Client()
    client.force_login(admin_user)
    with django_capture_on_commit_callbacks(execute=True):
        client.post(
            reverse("admin:accounts_user_changelist"),
            {"action": "approve_signups", "_selected_action": [dana.pk]},
        )
    (grant,) = grants(dana)
    assert grant.amount == CreditPolicy.current().grant_for(dana)


def test_approving_in_the_members_form_grants_too(
    admin_user: Any, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        finn = User.objects.create_user("finn", "finn@lab.example", approval=User.Approval.PENDING)
    client = Client()
    client.force_login(admin_user)
    page = client.get(reverse("admin:accounts_user_change", args=[finn.pk]))
    form = page.context["adminform"].form
    data = {
        name: value
        for name, value in form.initial.items()
        if value is not None and not isinstance(value, list | tuple)
    }
    data.update(approval=User.Approval.APPROVED, is_active="on")
    data.pop("password", None)
    data["date_joined_0"], data["date_joined_1"] = finn.date_joined.strftime(
        "%Y-%m-%d %H:%M:%S"
    ).split()
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("admin:accounts_user_change", args=[finn.pk]), data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    finn.refresh_from_db()
    assert finn.approval == User.Approval.APPROVED
    assert len(grants(finn)) == 1

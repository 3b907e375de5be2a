from __future__ import annotations

from typing import Any

import pytest
from django.test import Client, override_settings
from django.urls import reverse

from accounts.models import User
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def test_a_member_logs_in_and_out(client: Client, alice: Any) -> None:
    response = client.post(reverse("account_login"), {"login": "alice", "password": PASSWORD})
    assert response.status_code == 302
    assert client.get(reverse("dashboard")).status_code == 200
    client.post(reverse("account_logout"))
    response = client.get(reverse("dashboard"))
    assert response.status_code == 302
    assert reverse("account_login") in response["Location"]


def test_a_wrong_password_is_refused_with_a_message(client: Client, alice: Any) -> None:
    response = client.post(reverse("account_login"), {"login": "alice", "password": "nope"})
    assert response.status_code == 200
    assert "not correct" in response.content.decode()


def test_signup_is_closed_by_default(client: Client) -> None:
    response = client.post(
        reverse("account_signup"),
        {"username": "mallory", "email": "m@x.org", "password1": PASSWORD, "password2": PASSWORD},
    )
    assert "Sign Up Closed" in response.content.decode()
    assert not User.objects.filter(username="mallory").exists()


@override_settings(LABPORTAL_SIGNUP_MODE="approval")
def test_in_approval_mode_a_new_member_waits_for_an_admin(client: Client, admin_user: Any) -> None:
    client.post(
        reverse("account_signup"),
        {
            "username": "dana",
            "email": "dana@lab.example",
            "password1": PASSWORD,
            "password2": PASSWORD,
        },
    )
    dana = User.objects.get(username="dana")
    assert dana.approval == User.Approval.PENDING
    client.logout()
    response = client.post(
        reverse("account_login"), {"login": "dana", "password": PASSWORD}, follow=True
    )
    assert "waiting for an administrator" in response.content.decode()
    assert not response.context["user"].is_authenticated

    admin_client = Client()
    admin_client.force_login(admin_user)
    admin_client.post(
        reverse("admin:accounts_user_changelist"),
        {"action": "approve_signups", "_selected_action": [dana.pk]},
    )
    dana.refresh_from_db()
    assert dana.approval == User.Approval.APPROVED
    response = client.post(reverse("account_login"), {"login": "dana", "password": PASSWORD})
    assert response.status_code == 302
    assert client.get(reverse("dashboard")).status_code == 200


@pytest.mark.parametrize(
    "url_name", ["admin:index", "admin:accounts_user_changelist", "admin:cluster_node_changelist"]
)
def test_admin_pages_refuse_members(client: Client, charlie: Any, url_name: str) -> None:
    client.force_login(charlie)
    response = client.get(reverse(url_name))
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_admin_pages_open_for_staff(client: Client, admin_user: Any) -> None:
    client.force_login(admin_user)
    assert client.get(reverse("admin:cluster_node_changelist")).status_code == 200
    assert client.get(reverse("admin:accounts_category_changelist")).status_code == 200

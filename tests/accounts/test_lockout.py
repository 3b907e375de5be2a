"""Login lockout: per account and per address, short and announced, behind a trusted proxy.

In the issue-17 probe ~40 wrong passwords from one address locked every member out,
because the counter was per IP (everyone behind the proxy shares one) and per worker.
The test across two gunicorn workers and Redis is tests/e2e/test_login_lockout.py.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
import time_machine
from django.test import Client, RequestFactory
from django.urls import reverse

from accounts import lockout
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db

PROXY = "10.0.0.5"
ATTACKER = "203.0.113.9"
MEMBER = "198.51.100.7"


@pytest.fixture(autouse=True)
def lockout_settings(settings: Any) -> Any:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.LABPORTAL_TRUSTED_PROXIES = (ipaddress.ip_network("10.0.0.0/8"),)
    settings.LABPORTAL_LOGIN_FAILURES_PER_ACCOUNT = 5
    settings.LABPORTAL_LOGIN_FAILURES_PER_ADDRESS = 30
    settings.LABPORTAL_LOGIN_LOCKOUT_S = 300
    return settings


def sign_in(login: str, password: str, *, via_proxy_for: str | None = None) -> Any:
    """One sign-in through a fresh browser; `via_proxy_for` is the client behind the proxy."""
    headers: dict[str, Any] = {"REMOTE_ADDR": PROXY if via_proxy_for else MEMBER}
    if via_proxy_for:
        headers["HTTP_X_FORWARDED_FOR"] = via_proxy_for
    client = Client(**headers)
    return client.post(reverse("account_login"), {"login": login, "password": password})


def signed_in(response: Any) -> bool:
    return response.status_code == 302


def test_an_attacker_behind_the_proxy_does_not_lock_out_other_members(
    alice: Any, bob: Any, charlie: Any
) -> None:
    for i in range(40):
        sign_in("alice" if i % 4 == 0 else f"guess{i}", "wrong", via_proxy_for=ATTACKER)
    assert signed_in(sign_in("bob", PASSWORD, via_proxy_for=MEMBER))
    assert signed_in(sign_in("charlie", PASSWORD, via_proxy_for="198.51.100.8"))
    # The attacker's own address is paused, whatever the password.
    refused = sign_in("charlie", PASSWORD, via_proxy_for=ATTACKER)
    assert not signed_in(refused)
    assert "from your network address" in refused.content.decode()


def test_five_wrong_passwords_lock_the_account_for_a_few_announced_minutes(alice: Any) -> None:
    with time_machine.travel("2030-01-01 10:00:00+00:00", tick=False) as clock:
        for _ in range(4):
            response = sign_in("alice", "wrong", via_proxy_for=ATTACKER)
            assert "not correct" in response.content.decode()
        fifth = sign_in("alice", "wrong", via_proxy_for=ATTACKER)
        assert "It is locked for 5 more minutes" in fifth.content.decode()
        # The right password from elsewhere waits too: the account is what is locked.
        clock.shift(61)
        response = sign_in("ALICE", PASSWORD)
        assert not signed_in(response)
        assert "It is locked for 4 more minutes" in response.content.decode()
        clock.shift(240)
        assert signed_in(sign_in("alice", PASSWORD))


def test_the_email_address_and_the_username_share_one_counter(alice: Any) -> None:
    for i in range(5):
        sign_in(alice.email if i % 2 else "alice", "wrong", via_proxy_for=f"192.0.2.{i}")
    response = sign_in("alice", PASSWORD)
    assert "It is locked for 5 more minutes" in response.content.decode()


def test_a_right_password_forgets_the_accounts_failures(alice: Any) -> None:
    for _ in range(4):
        sign_in("alice", "wrong")
    assert signed_in(sign_in("alice", PASSWORD))
    for _ in range(4):
        sign_in("alice", "wrong")
    assert signed_in(sign_in("alice", PASSWORD))


def test_an_address_is_paused_after_thirty_failures_over_many_accounts(
    alice: Any, bob: Any
) -> None:
    for i in range(29):
        response = sign_in(f"guess{i}", "wrong", via_proxy_for=ATTACKER)
        assert "paused" not in response.content.decode()
    response = sign_in("guess-last", "wrong", via_proxy_for=ATTACKER)
    assert "paused for 5 more minutes" in response.content.decode()
    assert not signed_in(sign_in("bob", PASSWORD, via_proxy_for=ATTACKER))
    assert signed_in(sign_in("bob", PASSWORD, via_proxy_for=MEMBER))


def test_x_forwarded_for_is_ignored_unless_it_comes_from_a_trusted_proxy(alice: Any) -> None:
    factory = RequestFactory()
    direct = factory.get("/", REMOTE_ADDR=ATTACKER, HTTP_X_FORWARDED_FOR="198.51.100.1")
    assert lockout.client_address(direct) == ATTACKER
    proxied = factory.get("/", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=f"1.2.3.4, {ATTACKER}")
    assert lockout.client_address(proxied) == ATTACKER  # the nearest untrusted hop
    chained = factory.get("/", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=f"{ATTACKER}, 10.1.1.1")
    assert lockout.client_address(chained) == ATTACKER
    garbage = factory.get("/", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR="not-an-ip")
    assert lockout.client_address(garbage) == PROXY
    ipv6 = factory.get("/", REMOTE_ADDR="2001:db8:1:2:3:4:5:6")
    assert lockout.client_address(ipv6) == "2001:db8:1:2::"


def test_spoofing_x_forwarded_for_without_the_proxy_does_not_escape_the_address_lock(
    alice: Any,
) -> None:
    client = Client(REMOTE_ADDR=ATTACKER)
    for i in range(30):
        client.post(
            reverse("account_login"),
            {"login": f"guess{i}", "password": "wrong"},
            HTTP_X_FORWARDED_FOR=f"192.0.2.{i}",
        )
    response = client.post(
        reverse("account_login"),
        {"login": "alice", "password": PASSWORD},
        HTTP_X_FORWARDED_FOR="192.0.2.200",
    )
    assert not signed_in(response)
    assert "from your network address" in response.content.decode()


def test_the_admin_sign_in_goes_through_the_same_page(client: Client, charlie: Any) -> None:
    response = client.get("/admin/login/?next=/admin/")
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('account_login')}?next=%2Fadmin%2F"
    response = client.post("/admin/login/", {"username": "charlie", "password": PASSWORD})
    assert response.status_code == 302 and "_auth_user_id" not in client.session
    # A signed-in member without staff rights still gets the admin's own refusal.
    client.force_login(charlie)
    response = client.get("/admin/login/?next=/admin/")
    assert response.status_code == 200
    assert "not authorized" in response.content.decode()


def test_the_lockout_message_is_in_chinese_for_chinese_users(alice: Any) -> None:
    for _ in range(5):
        response = Client(HTTP_ACCEPT_LANGUAGE="zh-hans").post(
            reverse("account_login"), {"login": "alice", "password": "wrong"}
        )
    text = response.content.decode()
    assert "5" in text and "分钟" in text

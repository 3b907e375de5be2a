from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from accounts.models import PersonalAccessToken

pytestmark = pytest.mark.django_db


def test_a_token_is_stored_hashed_and_authenticates(alice: Any) -> None:
    token, secret = PersonalAccessToken.issue(user=alice, name="laptop")
    token.refresh_from_db()
    assert secret.startswith("lp_")
    assert secret not in (token.token_hash, token.token_prefix)
    assert token.token_hash == PersonalAccessToken.hash_secret(secret)
    assert PersonalAccessToken.authenticate(secret) == token
    assert PersonalAccessToken.authenticate(secret + "x") is None


def test_a_revoked_or_expired_token_no_longer_works(alice: Any) -> None:
    revoked, revoked_secret = PersonalAccessToken.issue(user=alice, name="old")
    revoked.revoke()
    assert PersonalAccessToken.authenticate(revoked_secret) is None
    _short, short_secret = PersonalAccessToken.issue(
        user=alice, name="short", lifetime=timedelta(days=1)
    )
    with time_machine.travel(timedelta(days=2)):
        assert PersonalAccessToken.authenticate(short_secret) is None


def test_the_token_page_shows_the_secret_once(client: Client, alice: Any) -> None:
    client.force_login(alice)
    response = client.post(reverse("token_list"), {"name": "ci"})
    secret = response.context["new_secret"]
    assert secret in response.content.decode()
    assert secret not in client.get(reverse("token_list")).content.decode()


def test_members_cannot_revoke_each_others_tokens(client: Client, alice: Any, charlie: Any) -> None:
    token, _secret = PersonalAccessToken.issue(user=alice, name="mine")
    client.force_login(charlie)
    assert client.post(reverse("token_revoke", args=[token.pk])).status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None


def test_the_api_answers_a_bad_token_with_401_and_how_to_fix_it(alice: Any) -> None:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION="Bearer lp_wrong")
    response = api.get(reverse("schema") + "?format=json")
    assert response.status_code == 401
    assert "API tokens" in json.loads(response.content)["detail"]


def test_the_api_accepts_a_valid_token(alice: Any) -> None:
    _token, secret = PersonalAccessToken.issue(user=alice, name="cli")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert api.get(reverse("schema")).status_code == 200

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


def test_authenticate_reads_what_the_orm_reads_in_one_statement(
    alice: Any, django_assert_num_queries: Any
) -> None:
    token, secret = PersonalAccessToken.issue(user=alice, name="laptop", lifetime=timedelta(days=3))
    with django_assert_num_queries(1):
        found = PersonalAccessToken.authenticate(secret)
        assert found is not None
        category = found.user.category  # loaded with the token: no second statement
    expected = PersonalAccessToken.objects.select_related("user__category").get(pk=token.pk)
    fields = PersonalAccessToken._meta.concrete_fields
    assert [f.value_from_object(found) for f in fields] == [
        f.value_from_object(expected) for f in fields
    ]
    user_fields = type(alice)._meta.concrete_fields
    assert [f.value_from_object(found.user) for f in user_fields] == [
        f.value_from_object(expected.user) for f in user_fields
    ]
    expected_category = expected.user.category
    assert category is not None and expected_category is not None
    assert category.pk == expected_category.pk
    assert category.max_queued_jobs == expected_category.max_queued_jobs


def test_a_member_without_a_category_authenticates_with_none(alice: Any) -> None:
    type(alice).objects.filter(pk=alice.pk).update(category=None)
    _token, secret = PersonalAccessToken.issue(user=alice, name="laptop")
    found = PersonalAccessToken.authenticate(secret)
    assert found is not None and found.user.category is None


def test_a_token_revoked_or_a_member_deactivated_is_refused_at_the_next_request(
    alice: Any, phd_category: Any
) -> None:
    token, secret = PersonalAccessToken.issue(user=alice, name="script")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert api.get("/api/queues/").status_code == 200
    # A change made by a plain UPDATE (no signal, no save()) is seen at once too.
    type(alice).objects.filter(pk=alice.pk).update(is_active=False)
    assert api.get("/api/queues/").status_code == 401
    type(alice).objects.filter(pk=alice.pk).update(is_active=True)
    assert api.get("/api/queues/").status_code == 200
    type(alice).objects.filter(pk=alice.pk).update(approval="pending")
    assert api.get("/api/queues/").status_code == 401
    type(alice).objects.filter(pk=alice.pk).update(approval="approved")
    assert api.get("/api/queues/").status_code == 200
    token.revoke()
    response = api.get("/api/queues/")
    assert response.status_code == 401
    assert "API tokens" in json.loads(response.content)["detail"]


def test_a_category_limit_changed_is_applied_to_the_next_api_submit(
    alice: Any, phd_category: Any, cluster: Any, image: Any
) -> None:
    _token, secret = PersonalAccessToken.issue(user=alice, name="script")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    job = {"image": image.reference, "command": ["echo", "hi"], "gpus": 2}
    assert api.post("/api/jobs/", job, format="json").status_code == 201
    type(phd_category).objects.filter(pk=phd_category.pk).update(max_concurrent_gpus=1)
    response = api.post("/api/jobs/", job, format="json")
    assert response.status_code == 400, response.content
    assert "at most 1 GPU at once" in response.content.decode()


def test_a_token_expiring_later_the_same_second_still_works_and_one_just_expired_does_not(
    alice: Any,
) -> None:
    # The expiry is compared in the database exactly as the ORM compares it.
    import time_machine

    token, secret = PersonalAccessToken.issue(user=alice, name="short", lifetime=timedelta(hours=1))
    expires = token.expires_at
    assert expires is not None
    with time_machine.travel(expires - timedelta(microseconds=500), tick=False):
        assert PersonalAccessToken.authenticate(secret) is not None
    with time_machine.travel(expires, tick=False):
        assert PersonalAccessToken.authenticate(secret) is None

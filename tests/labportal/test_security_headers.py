"""HSTS over https, a Content-Security-Policy everywhere, and no caching of signed-in pages.

That the pages work under the policy (no inline script or style refused) is checked
in a real browser: tests/browser/test_content_security_policy.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests.conftest import api_as

pytestmark = pytest.mark.django_db


def test_every_response_has_a_content_security_policy_without_inline_scripts(
    client: Client,
) -> None:
    policy = client.get("/accounts/login/")["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["script-src"] == "'self'"
    assert directives["style-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'"
    assert directives["object-src"] == "'none'"
    assert "unsafe-eval" not in policy


@pytest.mark.parametrize("url", ["/", "/jobs/", "/account/credits/", "/account/tokens/"])
def test_signed_in_pages_are_private_and_not_stored(client: Client, alice: Any, url: str) -> None:
    client.force_login(alice)
    response = client.get(url)
    assert response.status_code == 200
    cache_control = {part.strip() for part in response["Cache-Control"].split(",")}
    assert {"private", "no-store"} <= cache_control


def test_api_answers_to_a_token_are_not_stored_either(alice: Any) -> None:
    response = api_as(alice).get("/api/credits/")
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]


def test_hsts_is_sent_over_https_only(client: Client, settings: Any) -> None:
    settings.SECURE_HSTS_SECONDS = 31536000
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    secure = client.get("/accounts/login/", HTTP_X_FORWARDED_PROTO="https")
    assert secure["Strict-Transport-Security"] == "max-age=31536000"
    plain = client.get("/accounts/login/")
    assert "Strict-Transport-Security" not in plain

"""OpenID Connect sign-in end to end against a local provider the test starts.

The provider is a small one written here (http.server on a free port, PyJWT signing the
id_token with an RSA key): discovery, token, userinfo and JWKS endpoints. The portal's side
is allauth's openid_connect provider as settings.py configures it from the environment.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from django.test import Client
from django.urls import reverse

from accounts.models import Category, User
from labportal.campus_login import oidc_providers

pytestmark = pytest.mark.django_db

CLIENT_ID = "labportal"
SECRET = "s3cret"
CLAIMS = {
    "sub": "u-4711",
    "preferred_username": "cora",
    "email": "cora@campus.example",
    "given_name": "Cora",
    "family_name": "Chen",
    "groups": ["staff", "phd"],
    "uidNumber": 21001,
}


class Provider:
    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.codes: dict[str, dict[str, Any]] = {}
        self.claims = dict(CLAIMS)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.issuer = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, body: dict[str, Any], status: int = 200) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/.well-known/openid-configuration":
                    i = provider.issuer
                    self._json(
                        {
                            "issuer": i,
                            "authorization_endpoint": f"{i}/authorize",
                            "token_endpoint": f"{i}/token",
                            "userinfo_endpoint": f"{i}/userinfo",
                            "jwks_uri": f"{i}/jwks",
                            "token_endpoint_auth_methods_supported": ["client_secret_post"],
                        }
                    )
                elif self.path == "/userinfo":
                    if self.headers.get("Authorization") != "Bearer at-1":
                        self._json({"error": "invalid_token"}, 401)
                    else:
                        self._json(provider.claims)
                elif self.path == "/jwks":
                    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self_key()))
                    self._json({"keys": [{**public, "kid": "k1", "alg": "RS256"}]})
                else:
                    self._json({"error": "not_found"}, 404)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                grant = provider.codes.pop(form.get("code", ""), None)
                if (
                    self.path != "/token"
                    or grant is None
                    or form.get("client_id") != CLIENT_ID
                    or form.get("client_secret") != SECRET
                    or form.get("redirect_uri") != grant["redirect_uri"]
                ):
                    self._json({"error": "invalid_grant"}, 400)
                    return
                now = int(time.time())
                id_token = jwt.encode(
                    {
                        "iss": provider.issuer,
                        "aud": CLIENT_ID,
                        "sub": provider.claims["sub"],
                        "iat": now,
                        "exp": now + 300,
                    },
                    provider.key,
                    algorithm="RS256",
                    headers={"kid": "k1"},
                )
                self._json({"access_token": "at-1", "token_type": "Bearer", "id_token": id_token})

        def self_key() -> Any:
            return provider.key.public_key()

        return Handler

    def authorize(self, url: str) -> str:
        """What the campus's login page does once the person signed in: a code for them."""
        query = {k: v[0] for k, v in parse_qs(urlparse(url).query).items()}
        assert query["client_id"] == CLIENT_ID and "openid" in query["scope"]
        code = f"code-{len(self.codes) + 1}"
        self.codes[code] = {"redirect_uri": query["redirect_uri"]}
        return f"{query['redirect_uri']}?code={code}&state={query['state']}"


@pytest.fixture
def provider() -> Iterator[Provider]:
    p = Provider()
    thread = threading.Thread(target=p.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield p
    finally:
        p.server.shutdown()
        p.server.server_close()


@pytest.fixture
def oidc_settings(settings: Any, monkeypatch: Any, provider: Provider) -> Any:
    monkeypatch.setenv("LABPORTAL_OIDC_SERVER_URL", provider.issuer)
    monkeypatch.setenv("LABPORTAL_OIDC_CLIENT_ID", CLIENT_ID)
    monkeypatch.setenv("LABPORTAL_OIDC_CLIENT_SECRET", SECRET)
    monkeypatch.setenv("LABPORTAL_CAMPUS_NAME", "Example University")
    settings.SOCIALACCOUNT_PROVIDERS = oidc_providers()
    settings.LABPORTAL_OIDC_ENABLED = True
    settings.LABPORTAL_CAMPUS_NAME = "Example University"
    settings.LABPORTAL_OIDC_GROUP_CATEGORIES = {"phd": "PhD", "masters": "Master"}
    Category.objects.create(name="PhD")
    Category.objects.create(name="Master")
    return settings


def campus_sign_in(client: Client, provider: Provider) -> Any:
    start = client.post(
        reverse("openid_connect_login", kwargs={"provider_id": "campus"}), {"process": "login"}
    )
    assert start.status_code == 302 and start["Location"].startswith(provider.issuer + "/authorize")
    callback = urlparse(provider.authorize(start["Location"]))
    return client.get(f"{callback.path}?{callback.query}")


def test_the_sign_in_page_offers_the_campus(oidc_settings: Any) -> None:
    page = Client().get(reverse("account_login")).content.decode()
    assert "Sign in with Example University" in page


def test_a_campus_sign_in_creates_the_member_in_the_mapped_category(
    oidc_settings: Any, provider: Provider
) -> None:
    client = Client()
    done = campus_sign_in(client, provider)
    assert done.status_code == 302, done.content.decode()[:2000]
    cora = User.objects.get(username="cora")
    assert cora.email == "cora@campus.example"
    assert cora.category is not None and cora.category.name == "PhD"
    assert cora.unix_uid == 21001
    assert client.get(reverse("dashboard")).status_code == 200
    # The next sign-in follows a group change at the campus.
    provider.claims["groups"] = ["masters"]
    again = Client()
    assert campus_sign_in(again, provider).status_code == 302
    cora.refresh_from_db()
    assert cora.category is not None and cora.category.name == "Master"
    assert User.objects.filter(email="cora@campus.example").count() == 1


def test_a_forged_code_is_refused(oidc_settings: Any, provider: Provider) -> None:
    client = Client()
    start = client.post(
        reverse("openid_connect_login", kwargs={"provider_id": "campus"}), {"process": "login"}
    )
    state = parse_qs(urlparse(start["Location"]).query)["state"][0]
    callback = reverse("openid_connect_callback", kwargs={"provider_id": "campus"})
    client.get(f"{callback}?code=forged&state={state}")
    assert not User.objects.filter(username="cora").exists()

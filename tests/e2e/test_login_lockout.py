"""The login lockout across two real gunicorn workers that share Redis as their cache.

The issue-17 probe found the counters per worker and per IP: ~40 wrong passwords
from one address locked other members out. Here an attacker behind the trusted proxy
guesses from two connections at once; other members still sign in, the attacked
account and the attacker's address are locked for an announced time, and both
workers counted into the same Redis keys.
"""

from __future__ import annotations

import os
import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from django.conf import settings

from labportal.devstack import BIN, Stack, free_port, wait_for_port
from tests.conftest import PASSWORD, require_in_ci
from tests.e2e.test_jobs_end_to_end import database_url_for_children
from tests.factories import UserFactory

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
]

ATTACKER = "203.0.113.9"


class Browser:
    """One client behind the proxy: its own cookies and CSRF token, its address in X-Forwarded-For."""

    def __init__(self, base: str, address: str) -> None:
        self.base = base
        self.session = requests.Session()
        self.session.headers["X-Forwarded-For"] = address
        page = self.session.get(f"{base}/accounts/login/", timeout=30)
        match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert match, page.text[:500]
        self.token = match.group(1)

    def sign_in(self, login: str, password: str) -> requests.Response:
        return self.session.post(
            f"{self.base}/accounts/login/",
            data={"login": login, "password": password, "csrfmiddlewaretoken": self.token},
            headers={"Referer": f"{self.base}/accounts/login/"},
            allow_redirects=False,
            timeout=60,
        )


def signed_in(response: requests.Response) -> bool:
    return response.status_code == 302 and response.headers["Location"] == "/"


@pytest.fixture
def redis_cache_url() -> Any:
    if not settings.CELERY_BROKER_URL.startswith("redis://"):
        require_in_ci("a Redis server (CELERY_BROKER_URL=redis://…)")
    import redis

    url = settings.CELERY_BROKER_URL
    client = redis.Redis.from_url(url)

    def forget_lockouts() -> None:
        for key in client.scan_iter(match="labportal:*login-lockout:*"):
            client.delete(key)

    forget_lockouts()
    yield url, client
    forget_lockouts()


@pytest.fixture
def web(tmp_path: Path, redis_cache_url: Any) -> Any:
    url, _client = redis_cache_url
    port = int(os.environ.get("LABPORTAL_TEST_WEB_PORT") or free_port())
    env = {
        **os.environ,
        "DATABASE_URL": database_url_for_children(),
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "CACHE_URL": url,
        "LABPORTAL_VAR_DIR": str(tmp_path / "var"),
        "LABPORTAL_TRUSTED_PROXIES": "127.0.0.1",
        "LABPORTAL_LOGIN_FAILURES_PER_ACCOUNT": "5",
        "LABPORTAL_LOGIN_FAILURES_PER_ADDRESS": "12",
        "LABPORTAL_LOGIN_LOCKOUT_S": "300",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    stack = Stack(env=env, log_dir=tmp_path / "logs")
    stack.start(
        "web",
        [
            str(BIN / "gunicorn"),
            "labportal.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "2",
            "--access-logfile",
            "-",
            "--access-logformat",
            "worker=%(p)s %(m)s %(U)s %(s)s",
        ],
    )
    try:
        wait_for_port(port, timeout_s=60)
        yield f"http://127.0.0.1:{port}", stack
    finally:
        stack.stop()


def test_one_attacker_does_not_lock_out_other_members_across_two_workers(
    web: Any, redis_cache_url: Any
) -> None:
    base, stack = web
    for name in ("alice", "bob", "charlie", "erin"):
        UserFactory(username=name)

    # The attacker sprays wrong passwords over two connections at once: alice every
    # other guess, invented names otherwise (each password check costs real PBKDF2
    # time, so the address limit is 12 here rather than the default 30).
    guesses = ["alice" if i % 2 == 0 else f"guess-{uuid.uuid4().hex[:6]}" for i in range(16)]
    attackers = [Browser(base, ATTACKER), Browser(base, ATTACKER)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        answers = list(
            pool.map(lambda ig: attackers[ig[0] % 2].sign_in(ig[1], "wrong"), enumerate(guesses))
        )
    assert not any(signed_in(a) for a in answers)
    assert any("paused for 5 more minutes" in a.text for a in answers)

    # Other members, each at their own address behind the same proxy, sign in.
    assert signed_in(Browser(base, "198.51.100.7").sign_in("bob", PASSWORD))
    assert signed_in(Browser(base, "198.51.100.8").sign_in("charlie", PASSWORD))
    # The attacked account waits a few announced minutes, from any address.
    alice = Browser(base, "198.51.100.9").sign_in("alice", PASSWORD)
    assert not signed_in(alice)
    assert re.search(r"It is locked for [45] more minutes", alice.text)
    # The attacker's address is paused, even with a right password.
    paused = Browser(base, ATTACKER).sign_in("charlie", PASSWORD)
    assert not signed_in(paused)
    assert "from your network address" in paused.text

    # Five failures for erin over both connections lock erin: the workers share one count.
    erin_guessers = [Browser(base, "192.0.2.10"), Browser(base, "192.0.2.11")]
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda i: erin_guessers[i % 2].sign_in("erin", "wrong"), range(5)))
    erin = Browser(base, "192.0.2.12").sign_in("erin", PASSWORD)
    assert "It is locked for 5 more minutes" in erin.text

    stack.check_alive()
    workers = set(re.findall(r"worker=<?(\d+)>? POST /accounts/login/", stack.tail("web", 500)))
    assert len(workers) == 2, f"sign-ins were served by {workers}; expected both workers"
    _url, client = redis_cache_url
    assert list(client.scan_iter(match="labportal:*login-lockout:until:*")), "no lockout in Redis"

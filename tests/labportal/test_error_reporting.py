"""Errors reach the admins: ADMINS from the environment, mailed with DEBUG=false, and Sentry
behind SENTRY_DSN (here a local HTTP server standing in for Sentry's ingest endpoint)."""

from __future__ import annotations

import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.exceptions import ImproperlyConfigured

from labportal.error_reporting import admins_from, sample_rate_from
from tests.portal_process import run_portal_python


def test_admins_are_read_as_names_and_addresses() -> None:
    assert admins_from("Ann Lee <ann@lab.example.org>, ops@lab.example.org") == [
        ("Ann Lee", "ann@lab.example.org"),
        ("ops@lab.example.org", "ops@lab.example.org"),
    ]
    assert admins_from("") == []
    with pytest.raises(ImproperlyConfigured, match="without an email address"):
        admins_from("Ann Lee")


def test_a_bad_trace_sample_rate_is_refused_with_an_example() -> None:
    assert sample_rate_from("0.05") == 0.05
    assert sample_rate_from(None) == 0.0
    for bad in ("often", "1.5", "-0.1"):
        with pytest.raises(ImproperlyConfigured, match="from 0 to 1"):
            sample_rate_from(bad)


MAIL_AN_ERROR = """
import django, json
django.setup()
from django.test import Client
from django.core import mail
import logging
try:
    raise RuntimeError("the pass crashed")
except RuntimeError:
    logging.getLogger("django.request").error("Internal Server Error: /jobs/", exc_info=True)
print(json.dumps([[m.to, m.subject] for m in mail.outbox]))
"""


def test_an_unhandled_error_is_mailed_to_the_admins_with_debug_off() -> None:
    result = run_portal_python(
        # locmem is Django's test mail box: it keeps the mails in the process, to be read.
        "from django.test.utils import setup_test_environment; setup_test_environment()\n"
        + MAIL_AN_ERROR,
        DEBUG="false",
        SECRET_KEY="x" * 50,
        ALLOWED_HOSTS="lab.example.org",
        ADMINS="Ann Lee <ann@lab.example.org>",
    )
    assert result.returncode == 0, result.stderr
    mails = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(mails) == 1
    assert mails[0][0] == ["ann@lab.example.org"]
    assert "Internal Server Error: /jobs/" in mails[0][1]


class _Ingest(BaseHTTPRequestHandler):
    received: list[bytes] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        encoding = self.headers.get("Content-Encoding")
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "br":  # sentry-sdk compresses with brotli where it is installed
            import brotli

            body = brotli.decompress(body)
        _Ingest.received.append(body)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *_args: object) -> None:
        pass


SEND_TO_SENTRY = """
import django, logging
django.setup()
import sentry_sdk
client = sentry_sdk.get_client()
print(sorted(i for i in client.integrations if i in {"django", "celery", "logging"}))
try:
    raise ValueError("a member's job page broke")
except ValueError:
    logging.getLogger("jobqueue.views").exception("job page failed")
sentry_sdk.flush(timeout=10)
"""


def test_errors_go_to_sentry_with_the_django_and_celery_integrations_when_a_dsn_is_set() -> None:
    _Ingest.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ingest)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        result = run_portal_python(
            SEND_TO_SENTRY, SENTRY_DSN=f"http://publickey@127.0.0.1:{port}/42"
        )
    finally:
        server.shutdown()
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "['celery', 'django', 'logging']"
    events = b"\n".join(_Ingest.received)
    assert b"a member's job page broke" in events
    assert b"job page failed" in events


def test_without_a_dsn_nothing_is_sent() -> None:
    result = run_portal_python(
        "import django; django.setup(); import sentry_sdk; print(sentry_sdk.get_client().is_active())"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "False"

"""Request bodies are bounded before anything reads them (issue 25: a 300 MB JSON body was
parsed for 15.7 s and grew a web worker by 536 MB before its 400)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from django.test.client import FakePayload

from jobqueue.models import MAX_COMMAND_CHARS
from jobqueue.submit import MAX_BATCH
from tests.conftest import api_as

pytestmark = pytest.mark.django_db


def test_a_declared_300_mb_json_body_is_a_413_without_being_read(alice: Any) -> None:
    # FakePayload fails the test if more than its 2 bytes were read.
    response = api_as(alice).generic(
        "POST",
        "/api/jobs/",
        "{}",
        content_type="application/json",
        CONTENT_LENGTH=str(300 * 1024 * 1024),
    )
    assert response.status_code == 413
    assert response.json()["code"] == "request_too_large"
    assert "314,572,800 bytes" in response.json()["detail"]
    assert "at most 5,242,880" in response.json()["detail"]


def test_a_body_over_the_limit_is_refused_and_one_at_it_reaches_the_view(
    alice: Any, settings: Any
) -> None:
    settings.LABPORTAL_MAX_REQUEST_BYTES = 2048
    client = api_as(alice)
    over = json.dumps({"name": "x" * 2100})
    assert client.post("/api/jobs/", over, content_type="application/json").status_code == 413
    at_limit = json.dumps({"queue": "nowhere", "name": "x" * (2048 - 40)}).ljust(2048)
    assert len(at_limit) == 2048
    answer = client.post("/api/jobs/", at_limit, content_type="application/json")
    assert answer.status_code == 400  # the view's own answer: the fields are missing
    assert answer.json().get("code") != "request_too_large"


def test_a_page_gets_a_413_page_in_the_members_language(alice: Any, settings: Any) -> None:
    settings.LABPORTAL_MAX_REQUEST_BYTES = 1024
    client = Client(HTTP_ACCEPT_LANGUAGE="zh-hans")
    client.force_login(alice)
    response = client.post("/jobs/submit/", {"command": "x" * 2000})
    assert response.status_code == 413
    assert response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    assert 'data-testid="error-page"' in page and "413" in page
    assert "1,024" in page and "请求正文" in page


def test_a_chunked_body_without_a_length_is_a_411_that_says_to_send_the_length(
    alice: Any,
) -> None:
    request = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/api/jobs/",
        "CONTENT_TYPE": "application/json",
        "HTTP_TRANSFER_ENCODING": "chunked",
        "wsgi.input": FakePayload(b""),
    }
    response = api_as(alice).request(**request)
    assert response.status_code == 411
    assert response.json()["code"] == "length_required"
    assert "Content-Length" in response.json()["detail"]


def test_the_default_limit_holds_the_largest_batch_a_member_may_send() -> None:
    job = {
        "queue": "normal",
        "image": "labportal/pytorch:2.4-cuda12",
        "command": "x" * MAX_COMMAND_CHARS,
        "gpus": 1,
        "time_limit_s": 86400,
        "name": "sweep-000",
    }
    batch = json.dumps({"jobs": [job] * MAX_BATCH}).encode()
    assert len(batch) < settings.LABPORTAL_MAX_REQUEST_BYTES

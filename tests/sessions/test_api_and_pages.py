"""The API and the pages: start, list, read, stop; what another member sees."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from jobqueue.models import Job
from sessions import status as status_module
from sessions.status import SessionStatus
from tests.conftest import api_as
from tests.sessions.conftest import running_session

pytestmark = pytest.mark.django_db


def test_a_member_starts_a_session_through_the_api(cluster: Any, alice: Any, image: Any) -> None:
    answer = api_as(alice).post(
        "/api/sessions/",
        {"kind": "jupyter", "image": image.reference, "queue": "normal"},
        format="json",
    )
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert body["job"]["kind"] == "jupyter" and body["ready"] is False
    assert body["url"] == f"/sessions/{body['job']['id']}/lab"
    assert Job.objects.get(pk=body["job"]["id"]).owner == alice


def test_bad_input_gets_a_clear_400(cluster: Any, alice: Any, image: Any) -> None:
    answer = api_as(alice).post(
        "/api/sessions/", {"kind": "vscode", "image": image.reference}, format="json"
    )
    assert answer.status_code == 400 and "kind" in answer.json()
    answer = api_as(alice).post(
        "/api/sessions/", {"kind": "jupyter", "image": "nope"}, format="json"
    )
    assert answer.status_code == 400


def test_another_member_does_not_see_the_session(
    cluster: Any, alice: Any, charlie: Any, image: Any
) -> None:
    job = running_session(alice, image, gateway="http://127.0.0.1:9")
    listed = api_as(charlie).get("/api/sessions/").json()
    assert (listed["results"] if isinstance(listed, dict) else listed) == []
    mine = api_as(alice).get("/api/sessions/").json()
    assert [row["job"]["id"] for row in (mine["results"] if isinstance(mine, dict) else mine)] == [
        job.pk
    ]
    assert api_as(charlie).get(f"/api/sessions/{job.pk}/").status_code == 404
    assert api_as(charlie).post(f"/api/sessions/{job.pk}/stop/").status_code == 404


def test_read_says_ready_and_stop_stops_it(
    cluster: Any, alice: Any, image: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = running_session(alice, image, gateway="http://127.0.0.1:9")
    monkeypatch.setattr(
        "sessions.api.session_status", lambda job, username, **kw: SessionStatus(ready=True)
    )
    assert api_as(alice).get(f"/api/sessions/{job.pk}/").json()["ready"] is True
    answer = api_as(alice).post(f"/api/sessions/{job.pk}/stop/")
    assert answer.status_code == 202
    assert Job.objects.get(pk=job.pk).stop_requested_at is not None


def test_the_session_page_polls_until_ready(
    cluster: Any, alice: Any, bob: Any, image: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = running_session(alice, image, gateway="http://127.0.0.1:9")
    client = Client()
    client.force_login(alice)
    monkeypatch.setattr(
        "sessions.views.session_status", lambda job, username, **kw: SessionStatus(ready=False)
    )
    page = client.get(f"/jobs/{job.pk}/session/")
    assert page.status_code == 200 and b"hx-get" in page.content
    assert client.get(f"/jobs/{job.pk}/session/status/").status_code == 200
    monkeypatch.setattr(
        "sessions.views.session_status", lambda job, username, **kw: SessionStatus(ready=True)
    )
    ready = client.get(f"/jobs/{job.pk}/session/status/")
    assert ready.status_code == 286 and f"/sessions/{job.pk}/lab".encode() in ready.content
    other = Client()
    other.force_login(bob)
    assert other.get(f"/jobs/{job.pk}/session/").status_code == 403
    assert other.get(f"/jobs/{job.pk}/terminal/").status_code == 403


def test_the_new_session_form_queues_one(cluster: Any, alice: Any, image: Any) -> None:
    client = Client()
    client.force_login(alice)
    assert client.get("/sessions/new/").status_code == 200
    answer = client.post(
        "/sessions/new/",
        {"kind": "terminal", "image": image.reference, "queue": "normal", "gpus": 1},
    )
    job = Job.objects.get(owner=alice)
    assert answer.status_code == 302 and answer["Location"] == f"/jobs/{job.pk}/session/"
    assert job.kind == Job.Kind.TERMINAL
    assert client.get("/sessions/").status_code == 200
    assert status_module.PROBE_TIMEOUT_S > 0

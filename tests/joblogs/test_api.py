"""The log API and download: who may read, offsets for following, bad input, the file."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from joblogs.services import job_log_append
from tests.conftest import api_as

pytestmark = pytest.mark.django_db


def body(response: Any) -> Any:
    return json.loads(response.content)


@pytest.fixture
def logged_job(running_job: Any) -> Any:
    job_log_append(job_id=running_job.pk, stream="c1", offset=0, data=b"line 1\nline 2\n")
    job_log_append(job_id=running_job.pk, stream="c1", offset=14, data=b"line 3\n")
    return running_job


def test_the_owner_follows_the_log_by_offset(alice: Any, logged_job: Any) -> None:
    api = api_as(alice)
    first = body(api.get(f"/api/jobs/{logged_job.pk}/log/"))
    assert first["text"] == "line 1\nline 2\nline 3\n"
    assert first["next_offset"] == 21 and first["size"] == 21 and first["full"]
    assert not first["complete"]
    assert body(api.get(f"/api/jobs/{logged_job.pk}/log/?offset=21"))["text"] == ""
    job_log_append(job_id=logged_job.pk, stream="c1", offset=21, data=b"done\n", final=True)
    later = body(api.get(f"/api/jobs/{logged_job.pk}/log/?offset=21"))
    assert later["text"] == "done\n" and later["next_offset"] == 26 and later["complete"]
    assert body(api.get(f"/api/jobs/{logged_job.pk}/log/?tail=2"))["text"] == "line 3\ndone\n"


def test_staff_read_any_log_and_an_outsider_gets_404(
    admin_user: Any, charlie: Any, logged_job: Any
) -> None:
    assert api_as(admin_user).get(f"/api/jobs/{logged_job.pk}/log/").status_code == 200
    outsider = api_as(charlie)
    assert outsider.get(f"/api/jobs/{logged_job.pk}/log/").status_code == 404
    assert outsider.get(f"/api/jobs/{logged_job.pk}/log/download/").status_code == 404


def test_without_signing_in_the_log_is_refused(logged_job: Any) -> None:
    assert Client().get(f"/api/jobs/{logged_job.pk}/log/").status_code in (401, 403)
    assert Client().get(f"/api/jobs/{logged_job.pk}/log/download/").status_code in (401, 403)


@pytest.mark.parametrize(
    "query", ["offset=-1", "offset=abc", "limit=99999999999", "tail=x", "offset=1&tail=2"]
)
def test_bad_parameters_get_a_400_that_says_how_to_fix_them(
    alice: Any, logged_job: Any, query: str
) -> None:
    response = api_as(alice).get(f"/api/jobs/{logged_job.pk}/log/?{query}")
    assert response.status_code == 400
    assert (
        "offset" in response.content.decode()
        or "tail" in response.content.decode()
        or ("limit" in response.content.decode())
    )


def test_the_download_streams_the_whole_log_as_a_named_file(alice: Any, logged_job: Any) -> None:
    client = Client()
    client.force_login(alice)
    response = client.get(f"/api/jobs/{logged_job.pk}/log/download/")
    assert response.status_code == 200
    assert response.streaming
    assert response["Content-Disposition"] == f'attachment; filename="job-{logged_job.pk}.log"'
    assert b"".join(response.streaming_content) == b"line 1\nline 2\nline 3\n"  # type: ignore[attr-defined]


def test_a_job_without_a_full_log_answers_with_its_end_events_tail(
    alice: Any, running_job: Any
) -> None:
    running_job.log_tail = "the tail\n"
    running_job.save(update_fields=["log_tail"])
    answer = body(api_as(alice).get(f"/api/jobs/{running_job.pk}/log/"))
    assert answer["text"] == "the tail\n" and answer["full"] is False


def test_the_job_page_shows_the_live_log_panel(alice: Any, logged_job: Any) -> None:
    client = Client()
    client.force_login(alice)
    page = client.get(f"/jobs/{logged_job.pk}/").content.decode()
    assert 'data-testid="job-log"' in page
    assert f"/api/v1/jobs/{logged_job.pk}/log/download/" in page
    assert "js/joblog.js" in page

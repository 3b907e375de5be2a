"""The API's rate limits: 429 with Retry-After past a rate, counted per token (a member's
second script is not blocked by the first's), with submits and reports limited apart from
reads. (A request without valid credentials is refused with 401 before any rate counts.)"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import api_as

pytestmark = pytest.mark.django_db

SUBMIT = {"image": "labportal/busybox:test", "command": ["true"]}


@pytest.fixture
def rates(settings: Any) -> dict[str, str]:
    settings.LABPORTAL_API_RATES = {"api": "1000/min", "submit": "3/min", "report": "1/hour"}
    return settings.LABPORTAL_API_RATES


def test_the_fourth_submit_in_a_minute_gets_429_with_retry_after(
    rates: Any, alice: Any, cluster: Any, image: Any
) -> None:
    api = api_as(alice)
    for _ in range(3):
        assert api.post("/api/jobs/", SUBMIT, format="json").status_code == 201
    refused = api.post("/api/jobs/", SUBMIT, format="json")
    assert refused.status_code == 429
    assert 0 < int(refused["Retry-After"]) <= 60
    assert "throttled" in refused.json()["detail"].lower()
    # Reads are not submits: the same token still lists its jobs.
    assert api.get("/api/jobs/").status_code == 200


def test_a_batch_counts_as_one_submit(rates: Any, alice: Any, cluster: Any, image: Any) -> None:
    api = api_as(alice)
    batch = {"jobs": [SUBMIT] * 10}
    for _ in range(3):
        assert api.post("/api/jobs/batch/", batch, format="json").status_code == 201
    assert api.post("/api/jobs/batch/", batch, format="json").status_code == 429


def test_each_token_has_its_own_count(rates: Any, alice: Any, cluster: Any, image: Any) -> None:
    first, second = api_as(alice), api_as(alice)
    for _ in range(3):
        first.post("/api/jobs/", SUBMIT, format="json")
    assert first.post("/api/jobs/", SUBMIT, format="json").status_code == 429
    assert second.post("/api/jobs/", SUBMIT, format="json").status_code == 201


def test_every_request_counts_against_the_api_rate(settings: Any, alice: Any) -> None:
    settings.LABPORTAL_API_RATES = {"api": "5/min"}
    api = api_as(alice)
    answers = [api.get("/api/queues/").status_code for _ in range(6)]
    assert answers == [200] * 5 + [429]


def test_report_generation_has_its_own_rate(rates: Any, alice: Any) -> None:
    api = api_as(alice)
    request = {"kind": "pdf", "period": "month", "language": "en"}
    first = api.post("/api/reports/tasks/", request, format="json")
    assert first.status_code == 201, first.content
    second = api.post("/api/reports/tasks/", request, format="json")
    assert second.status_code == 429
    assert int(second["Retry-After"]) > 60


def test_a_rate_that_is_not_a_rate_is_refused_at_start_with_an_example() -> None:
    from tests.portal_process import run_portal_python

    result = run_portal_python("import django; django.setup()", LABPORTAL_API_RATE_SUBMIT="fast")
    assert result.returncode != 0
    assert "LABPORTAL_API_RATE_SUBMIT must be a rate such as 240/min" in result.stderr
    off = run_portal_python(
        "import django; django.setup(); from django.conf import settings; "
        "print(sorted(settings.LABPORTAL_API_RATES))",
        LABPORTAL_API_RATE_SUBMIT="off",
    )
    assert off.stdout.strip().splitlines()[-1] == "['api', 'report']"

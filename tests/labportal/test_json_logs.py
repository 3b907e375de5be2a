"""LOG_FORMAT=json: one JSON object a line with the request id, the member and the job."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from django.test import Client

from core.log_context import JsonFormatter, task_context_from
from tests.conftest import api_as
from tests.portal_process import run_portal_python

pytestmark = pytest.mark.django_db


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def collected() -> Any:
    handler = Collect()
    logger = logging.getLogger("django.request")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def test_a_refused_api_request_logs_one_json_line_with_its_request_id_and_member(
    alice: Any, collected: Collect
) -> None:
    response = api_as(alice).get("/api/jobs/999999/", HTTP_X_REQUEST_ID="proxy-req-12345678")
    assert response.status_code == 404
    assert response["X-Request-ID"] == "proxy-req-12345678"
    event = json.loads(collected.lines[-1])
    assert event["level"] == "WARNING" and event["logger"] == "django.request"
    assert event["message"].startswith("Not Found: /api/jobs/999999/")
    assert event["request_id"] == "proxy-req-12345678"
    assert event["user"] == "alice"
    assert event["time"].endswith("+00:00")


def test_a_request_id_that_is_no_id_is_replaced_and_pages_carry_the_session_member(
    alice: Any, collected: Collect
) -> None:
    client = Client()
    client.force_login(alice)
    response = client.get("/jobs/999999/", HTTP_X_REQUEST_ID='bad"\nid')
    assert response.status_code == 404
    rid = response["X-Request-ID"]
    assert len(rid) == 32 and rid.isalnum()
    event = json.loads(collected.lines[-1])
    assert event["request_id"] == rid and event["user"] == "alice"


def test_a_tasks_records_carry_its_id_and_job_and_extras_win() -> None:
    record = logging.LogRecord(
        "jobqueue.tasks", logging.ERROR, __file__, 1, "end of %s", ("x",), None
    )
    record.node = "gpu-01"
    task_context_from(task_id_value="c0ffee", kwargs={"job_id": 42})
    try:
        event = json.loads(JsonFormatter().format(record))
    finally:
        task_context_from(task_id_value=None, kwargs=None)
    assert event["message"] == "end of x"
    assert (event["task_id"], event["job_id"], event["node"]) == ("c0ffee", 42, "gpu-01")
    assert "request_id" not in event and "user" not in event


def test_log_format_json_is_what_the_processes_print() -> None:
    result = run_portal_python(
        "import django, logging; django.setup(); "
        "logging.getLogger('labportal').warning('backup is late', extra={'hours': 30})",
        LOG_FORMAT="json",
    )
    assert result.returncode == 0, result.stderr
    event = json.loads(result.stderr.strip().splitlines()[-1])
    assert event["message"] == "backup is late" and event["hours"] == 30
    bad = run_portal_python("import django; django.setup()", LOG_FORMAT="yaml")
    assert bad.returncode != 0 and "LOG_FORMAT" in bad.stderr


def test_no_context_is_left_once_a_request_finished(alice: Any) -> None:
    from core import log_context

    api_as(alice).get("/api/jobs/")
    assert log_context.request_id.get() is None and log_context.user_name.get() is None

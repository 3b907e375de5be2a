"""Every text a member or an admin can send, at its limit, at 10x and at 100x its limit.

At the limit the text is taken (or refused for another reason: an unknown image is
still unknown). Over it, the answer is a 400 that names the field and its limit, and
nothing is stored: never a 500, a hang, or a text silently cut short. Each case also
runs in bounded time, since every check on the way is linear in the text's length
(see tests/scheduler/test_predict.py for the shape of a megabyte-long command).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.utils import timezone

from accounts.models import CreditPolicy, PersonalAccessToken
from handbook.models import RuleSuggestion
from jobqueue.models import (
    MAX_COMMAND_ARGS,
    MAX_COMMAND_CHARS,
    MAX_ENV_NAME_CHARS,
    MAX_ENV_VALUE_CHARS,
    EmergencyRequest,
    Job,
    PriorityGrant,
    Queue,
)
from reports.models import ReportTask
from reservations.models import Reservation
from tests.conftest import api_as

pytestmark = pytest.mark.django_db

TIMES = (1, 10, 100)
IMAGE = "labportal/busybox:test"


def text(n: int) -> str:
    return "x" * n


@dataclass(frozen=True)
class Case:
    """One text field: where it is sent, how a value of length n is put in, its limit."""

    name: str
    url: str | Callable[[Any], str]
    field: str
    limit: int
    payload: Callable[[int, Any], dict[str, Any]]
    stored: type[Any]  # a model: its rows are counted before and after
    staff: bool = False


def job(**fields: Any) -> dict[str, Any]:
    return {"image": IMAGE, "command": "true", **fields}


def grant(**fields: Any) -> dict[str, Any]:
    deadline = (timezone.now() + timedelta(days=5)).isoformat()
    return {"reason": "the ICML deadline", "deadline": deadline, "gpus_expected": 1, **fields}


def booking(**fields: Any) -> dict[str, Any]:
    start = (timezone.now() + timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
    return {
        "node": "gpu01",
        "gpu_count": 1,
        "start": start.isoformat(),
        "end": (start + timedelta(hours=1)).isoformat(),
        **fields,
    }


API_CASES = [
    Case("job name", "/api/jobs/", "name", 120, lambda n, s: job(name=text(n)), Job),
    Case("job command", "/api/jobs/", "command", MAX_COMMAND_CHARS,
         lambda n, s: job(command=text(n)), Job),
    Case("job command as a list", "/api/jobs/", "command", MAX_COMMAND_CHARS,
         lambda n, s: job(command=["python", text(n - len("python "))]), Job),
    Case("job command's arguments", "/api/jobs/", "command", MAX_COMMAND_ARGS,
         lambda n, s: job(command=["x"] * n), Job),
    Case("job env value", "/api/jobs/", "env", MAX_ENV_VALUE_CHARS,
         lambda n, s: job(env={"A": text(n)}), Job),
    Case("job env name", "/api/jobs/", "env", MAX_ENV_NAME_CHARS,
         lambda n, s: job(env={"A" * n: "1"}), Job),
    Case("job GPU model", "/api/jobs/", "gpu_model", 120, lambda n, s: job(gpu_model=text(n)), Job),
    Case("job image", "/api/jobs/", "image", 255, lambda n, s: job(image=text(n)), Job),
    Case("job queue", "/api/jobs/", "queue", 32, lambda n, s: job(queue=text(n)), Job),
    Case("job mount", "/api/jobs/", "mounts", 40, lambda n, s: job(mounts=[text(n)]), Job),
    Case("job mounts", "/api/jobs/", "mounts", 100, lambda n, s: job(mounts=["m"] * n), Job),
    Case("batch", "/api/jobs/batch/", "jobs", 500, lambda n, s: {"jobs": [job()] * n}, Job),
    Case("batch job's command", "/api/jobs/batch/", "jobs", MAX_COMMAND_CHARS,
         lambda n, s: {"jobs": [job(command=text(n))]}, Job),
    Case("grant reason", "/api/grants/", "reason", 2000,
         lambda n, s: grant(reason=text(n)), PriorityGrant),
    Case("grant decision comment", lambda s: f"/api/grants/{s['grant'].pk}/approve/", "comment",
         2000, lambda n, s: {"comment": text(n)}, PriorityGrant, staff=True),
    Case("emergency reason", "/api/emergencies/", "reason", 2000,
         lambda n, s: {"jobs": [s["job"].pk], "reason": text(n)}, EmergencyRequest),
    Case("emergency jobs", "/api/emergencies/", "jobs", 100,
         lambda n, s: {"jobs": [s["job"].pk] * n, "reason": "defence"}, EmergencyRequest),
    Case("booking note", "/api/reservations/", "note", 200,
         lambda n, s: booking(note=text(n)), Reservation),
    Case("replay option label", "/api/reports/tasks/", "options", 80,
         lambda n, s: {"kind": "replay", "options": [{"label": text(n)}]}, ReportTask, staff=True),
    Case("replay option GPU model", "/api/reports/tasks/", "options", 120,
         lambda n, s: {"kind": "replay", "options": [{"gpu_model": text(n)}]}, ReportTask,
         staff=True),
    Case("replay options", "/api/reports/tasks/", "options", 6,
         lambda n, s: {"kind": "replay", "options": [{"label": "a"}] * n}, ReportTask, staff=True),
]  # fmt: skip


def web_job(**fields: Any) -> dict[str, Any]:
    return {
        "queue": "normal",
        "image": IMAGE,
        "command": "true",
        "gpus": 1,
        "cpus": "4",
        "memory_gb": "16",
        **fields,
    }


def web_grant(**fields: Any) -> dict[str, Any]:
    deadline = timezone.localtime() + timedelta(days=5)
    return {
        "reason": "the deadline",
        "deadline": f"{deadline:%Y-%m-%dT%H:%M}",
        "gpus_expected": 1,
        **fields,
    }


WEB_CASES = [
    Case("job name", "/jobs/submit/", "name", 120, lambda n, s: web_job(name=text(n)), Job),
    Case("job command", "/jobs/submit/", "command", MAX_COMMAND_CHARS,
         lambda n, s: web_job(command=text(n)), Job),
    Case("job env value", "/jobs/submit/", "env", MAX_ENV_VALUE_CHARS,
         lambda n, s: web_job(env="A=" + text(n)), Job),
    Case("job env name", "/jobs/submit/", "env", MAX_ENV_NAME_CHARS,
         lambda n, s: web_job(env="A" * n + "=1"), Job),
    Case("token name", "/account/tokens/", "name", 80,
         lambda n, s: {"name": text(n)}, PersonalAccessToken),
    Case("rule suggestion topic", "/rules/", "topic", 120,
         lambda n, s: {"topic": text(n), "text": "shorter debug jobs"}, RuleSuggestion),
    Case("rule suggestion", "/rules/", "text", 4000,
         lambda n, s: {"topic": "debug", "text": text(n)}, RuleSuggestion),
    Case("grant reason", "/jobs/grants/apply/", "reason", 2000,
         lambda n, s: web_grant(reason=text(n)), PriorityGrant),
    Case("emergency reason", "/jobs/emergencies/apply/", "reason", 2000,
         lambda n, s: {"jobs": [s["job"].pk], "reason": text(n), "hours": 1}, EmergencyRequest),
    Case("booking note", "/reservations/book/", "note", 200,
         lambda n, s: {"node": "gpu01", "gpu_count": 1, "note": text(n),
                       **{k: v[:16] for k, v in booking().items() if k in ("start", "end")}},
         Reservation),
]  # fmt: skip

# Forms that answer by redirecting with a message (an admin's decision row, the report
# page's replay form): the message names the field and its limit.
REDIRECT_CASES = [
    Case("grant decision comment", lambda s: f"/jobs/approvals/grants/{s['grant'].pk}/decide/",
         "comment", 2000, lambda n, s: {"decision": "approve", "comment": text(n)},
         PriorityGrant, staff=True),
    Case("replay GPU model", "/reports/tasks/", "gpu_model", 120,
         lambda n, s: {"kind": "replay", "gpu_model": text(n), "gpu_count": 1}, ReportTask,
         staff=True),
]  # fmt: skip


@pytest.fixture
def setting(alice: Any, cluster: Any, image: Any, queues: Any) -> dict[str, Any]:
    """What the cases refer to: a waiting job of alice's, her pending grant, a policy."""
    from jobqueue.submit import job_submit

    CreditPolicy.objects.update_or_create(pk=1, defaults={"emergency_max_uses": 1000})
    waiting = job_submit(owner=alice, queue="normal", image=IMAGE, command="sleep 1")
    pending = PriorityGrant.objects.create(
        user=alice,
        queue=Queue.objects.get(requires_grant=True),
        reason="thesis",
        deadline=timezone.now() + timedelta(days=3),
    )
    return {"job": waiting, "grant": pending}


def url_of(case: Case, setting: dict[str, Any]) -> str:
    return case.url(setting) if callable(case.url) else case.url


def changed(case: Case, before: int, setting: dict[str, Any]) -> bool:
    if case.stored is PriorityGrant and case.staff:
        return PriorityGrant.objects.get(pk=setting["grant"].pk).state != "pending"
    return case.stored.objects.count() != before


def ids(cases: list[Case]) -> list[str]:
    return [case.name for case in cases]


def length(case: Case, times: int) -> int:
    """The limit itself, or one more than ``times`` the limit."""
    return case.limit * times + (times > 1)


def post_form(client: Client, case: Case, times: int, setting: dict[str, Any]) -> Any:
    response = client.post(url_of(case, setting), case.payload(length(case, times), setting))
    assert response.status_code < 500
    return response


@pytest.mark.parametrize("times", TIMES)
@pytest.mark.parametrize("case", API_CASES, ids=ids(API_CASES))
def test_the_api_refuses_a_text_over_its_limit_naming_the_field_and_the_limit(
    case: Case, times: int, setting: dict[str, Any], alice: Any, admin_user: Any
) -> None:
    before = case.stored.objects.count()
    client = api_as(admin_user if case.staff else alice)
    payload = case.payload(length(case, times), setting)
    response = client.post(url_of(case, setting), payload, format="json")
    assert response.status_code < 500
    body = json.loads(response.content) if response.content else {}
    about_field = json.dumps(body.get(case.field, "") if isinstance(body, dict) else "")
    if times == 1:
        # Taken, or refused for another reason than its length.
        assert response.status_code < 400 or str(case.limit) not in about_field, body
        return
    assert response.status_code in (400, 413), body
    assert str(case.limit) in about_field, body
    assert not changed(case, before, setting)


def said_about(response: Any, case: Case) -> str:
    """What the answer says about the case's field: its form errors, or (a form that
    redirects) the messages it left, which name the field themselves."""
    if case in REDIRECT_CASES:
        said = " ".join(str(m) for m in get_messages(response.wsgi_request))
        return said if f"“{case.field}”" in said else ""
    form = response.context["form"] if response.status_code == 400 else None
    return " ".join(form.errors.get(case.field, [])) if form is not None else ""


@pytest.mark.parametrize("times", TIMES)
@pytest.mark.parametrize("case", WEB_CASES + REDIRECT_CASES, ids=ids(WEB_CASES + REDIRECT_CASES))
def test_a_form_refuses_a_text_over_its_limit_naming_the_field_and_the_limit(
    case: Case, times: int, setting: dict[str, Any], client: Client, alice: Any, admin_user: Any
) -> None:
    client.force_login(admin_user if case.staff else alice)
    before = case.stored.objects.count()
    response = post_form(client, case, times, setting)
    said = said_about(response, case)
    if times == 1:
        assert str(case.limit) not in said
        return
    assert response.status_code == (302 if case in REDIRECT_CASES else 400)
    assert str(case.limit) in said
    if case in WEB_CASES:
        assert str(case.limit) in response.content.decode()  # shown on the page
    assert not changed(case, before, setting)

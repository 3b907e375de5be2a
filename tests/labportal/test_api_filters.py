"""Every list of the API filters through django-filter: a bad value is a 400 naming the
allowed ones, a good one filters, and the schema documents each filter."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from tests.conftest import api_as

# (list path, parameter, a good value, a bad value)
FILTERS = [
    ("/api/v1/jobs/", "state", "pending,running", "sleeping"),
    ("/api/v1/jobs/", "active", "true", "yes"),
    ("/api/v1/sessions/", "state", "running", "sleeping"),
    ("/api/v1/sessions/", "kind", "jupyter", "vnc"),
    ("/api/v1/alerts/", "state", "firing", "burning"),
    ("/api/v1/alerts/", "kind", "gpu_hot", "gpu_cold"),
    ("/api/v1/grants/", "state", "pending", "maybe"),
    ("/api/v1/emergencies/", "state", "pending", "maybe"),
    ("/api/v1/reservations/", "state", "booked,active", "someday"),
    ("/api/v1/ledger/", "kind", "charge", "bonus"),
    ("/api/v1/ledger/", "month", "2025-03", "2025-13"),
    ("/api/v1/notifications/", "unread", "1", "maybe"),
    ("/api/v1/reports/tasks/", "kind", "pdf", "docx"),
    ("/api/v1/reports/tasks/", "state", "done", "lost"),
]


@pytest.mark.parametrize(("path", "name", "good", "bad"), FILTERS)
def test_a_bad_filter_is_a_400_that_says_what_it_may_be(
    alice: Any, path: str, name: str, good: str, bad: str
) -> None:
    client = api_as(alice)
    refused = client.get(path, {name: bad})
    assert refused.status_code == 400, refused.content
    message = refused.json()[name][0]
    assert bad in message or "YYYY-MM" in message
    if name in ("state", "kind", "active", "unread"):
        assert good.split(",")[0] in message  # the allowed values are named
    assert client.get(path, {name: good}).status_code == 200


def test_the_filters_filter(alice: Any, admin_user: Any, cluster: Any, image: Any) -> None:
    from alerts.models import Alert
    from tests.jobqueue.test_submit import submit

    running = submit(alice, command="python a.py")
    running.state = "running"
    running.save(update_fields=["state"])
    submit(alice, command="python b.py")  # stays waiting
    client = api_as(alice)
    ids = {j["id"] for j in client.get("/api/v1/jobs/", {"state": "running"}).json()["results"]}
    assert ids == {running.pk}
    # Spaces after the commas and a trailing comma are what people type.
    both = client.get("/api/v1/jobs/", {"state": "running, pending,"}).json()["results"]
    assert len(both) == 2
    Alert.objects.create(kind="gpu_hot", subject="gpu:1", state="firing")
    Alert.objects.create(kind="idle_job", subject="job:1", state="resolved")
    staff = api_as(admin_user)
    kinds = [a["kind"] for a in staff.get("/api/v1/alerts/", {"state": "firing"}).json()["results"]]
    assert kinds == ["gpu_hot"]
    assert staff.get("/api/v1/alerts/", {"kind": "idle_job"}).json()["count"] == 1


def test_the_schema_documents_every_filter(alice: Any) -> None:
    schema = api_as(alice).get(reverse("schema") + "?format=json").json()
    for path, name, good, _bad in FILTERS:
        parameters = {p["name"]: p for p in schema["paths"][path]["get"]["parameters"]}
        assert name in parameters, (path, name)
        described = parameters[name]["schema"]
        values = described.get("items", described).get("enum")
        if values is not None:
            assert good.split(",")[0] in values, (path, name, values)

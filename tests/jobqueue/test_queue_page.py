"""The queue page reads only the columns it shows, and still shows everything it did."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from jobqueue.models import Allocation, Job
from scheduling.passes import scheduling_pass
from tests.jobqueue.test_submit import submit

pytestmark = pytest.mark.django_db


def queue_page(client: Client) -> tuple[str, int]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/jobs/queue/")
    assert response.status_code == 200
    return response.content.decode(), len(queries.captured_queries)


def test_the_queue_page_costs_the_same_statements_for_many_jobs_and_shows_each_field(
    alice: Any, bob: Any, cluster: Any, image: Any, sent_tasks: Any
) -> None:
    client = Client()
    client.force_login(alice)
    running = submit(alice, gpus=2)
    scheduling_pass()
    submit(bob, gpus=4)
    queue_page(client)  # the session and the first-use rows
    _html, few = queue_page(client)

    more_running = [submit(bob, gpus=1) for _ in range(3)]
    scheduling_pass()
    waiting = [submit(alice, gpus=4) for _ in range(6)] + [submit(bob)]
    held = waiting[0]
    Job.objects.filter(pk=held.pk).update(state=Job.State.HELD, hold_reason="disk quota")
    html, many = queue_page(client)

    # Deferred columns read one row at a time would add a statement per job.
    assert many == few
    assert "Held by a lab admin: disk quota" in html
    labels = [
        a.gpu.label for a in Allocation.objects.filter(active=True).select_related("gpu__node")
    ]
    assert len(labels) == 8  # the cluster is full: every GPU is shown with its job
    assert all(label in html for label in labels)
    assert running.pk in Allocation.objects.filter(active=True).values_list("job_id", flat=True)
    assert f'href="/jobs/{waiting[1].pk}/"' in html  # alice's own job links to its page
    assert f'<td data-label="Job">{more_running[0].pk}</td>' in html  # bob's does not
    assert '<td data-label="Owner">bob</td>' in html

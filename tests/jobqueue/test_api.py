"""The jobs API and pages, with alice (owner), bob (same category), charlie (outsider) and an admin."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from jobqueue.models import Job
from tests.conftest import api_as
from tests.jobqueue.test_submit import submit

pytestmark = pytest.mark.django_db


def body(response: Any) -> Any:
    return json.loads(response.content)


def test_a_member_submits_through_the_api_and_reads_it_back(
    alice: Any, cluster: Any, image: Any
) -> None:
    api = api_as(alice)
    response = api.post(
        "/api/jobs/",
        {"image": "labportal/busybox:test", "command": ["echo", "hi"], "gpus": 2},
        format="json",
    )
    assert response.status_code == 201, response.content
    job_id = body(response)["id"]
    assert body(api.get(f"/api/jobs/{job_id}/"))["state"] == "pending"
    assert [j["id"] for j in body(api.get("/api/jobs/?state=pending"))["results"]] == [job_id]


def test_a_submits_answer_reads_nothing_back_and_each_answer_is_its_own(
    alice: Any, cluster: Any, image: Any
) -> None:
    """The answer is built from the job just saved: no query for its GPUs, mounts or Slurm
    row (agents mode has none), and serializers that share their built fields per class
    still give each answer its own values."""
    api = api_as(alice)
    answers = []
    for name in ("first", "second"):
        with CaptureQueriesContext(connection) as queries:
            response = api.post(
                "/api/jobs/",
                {"image": "labportal/busybox:test", "command": ["true"], "name": name},
                format="json",
            )
        assert response.status_code == 201, response.content
        answers.append(body(response))
        read_back = [
            q["sql"]
            for q in queries.captured_queries
            if any(t in q["sql"] for t in ("slurm_slurmjob", "jobqueue_allocation", "mounts"))
        ]
        assert read_back == []
    assert [a["name"] for a in answers] == ["first", "second"]
    assert answers[0]["id"] != answers[1]["id"]
    assert answers[0]["slurm"] is None and answers[0]["gpu_uuids"] == []
    assert answers[0]["mounts"] == [] and answers[0]["owner"] == alice.username


def test_a_refusal_is_a_clear_4xx_with_a_code(alice: Any, cluster: Any, image: Any) -> None:
    response = api_as(alice).post("/api/jobs/", {"image": "evil:1", "command": "x"}, format="json")
    assert response.status_code == 400
    assert body(response)["code"] == "image_not_allowed"
    assert "allowlist" in body(response)["detail"]
    response = api_as(alice).post(
        "/api/jobs/", {"image": "labportal/busybox:test", "command": {"a": 1}}, format="json"
    )
    assert response.status_code == 400
    assert "list of strings" in json.dumps(body(response))


def test_other_members_cannot_see_or_cancel_a_job(
    alice: Any, bob: Any, charlie: Any, cluster: Any, image: Any
) -> None:
    job = submit(alice, env={"SECRET": "s3"})
    for outsider in (bob, charlie):
        api = api_as(outsider)
        assert api.get(f"/api/jobs/{job.pk}/").status_code == 404
        assert api.post(f"/api/jobs/{job.pk}/cancel/").status_code == 404
        assert api.get(f"/api/jobs/{job.pk}/logs/").status_code == 404
        assert body(api.get("/api/jobs/"))["results"] == []
    job.refresh_from_db()
    assert job.state == Job.State.PENDING


def test_the_queue_overview_shows_owner_size_and_queue_but_never_command_or_env(
    alice: Any, charlie: Any, cluster: Any, image: Any
) -> None:
    submit(alice, env={"SECRET": "s3"}, command="python secret_project.py")
    overview = body(api_as(charlie).get("/api/queues/overview/"))
    [entry] = overview["waiting"]
    assert entry["owner"] == "alice" and entry["gpus"] == 1 and entry["queue"] == "normal"
    dumped = json.dumps(overview)
    assert "secret_project" not in dumped and "s3" not in dumped


def test_the_admin_sees_and_cancels_any_job(
    alice: Any, admin_user: Any, cluster: Any, image: Any
) -> None:
    job = submit(alice)
    api = api_as(admin_user)
    assert api.get(f"/api/jobs/{job.pk}/").status_code == 200
    assert body(api.post(f"/api/jobs/{job.pk}/cancel/"))["state"] == "cancelled"


def test_the_api_refuses_anonymous_requests(cluster: Any) -> None:
    from rest_framework.test import APIClient

    assert APIClient().get("/api/jobs/").status_code in (401, 403)
    assert APIClient().get("/api/queues/").status_code in (401, 403)


def test_queues_are_listed_with_their_limits(alice: Any) -> None:
    names = [q["name"] for q in body(api_as(alice).get("/api/queues/"))["results"]]
    assert names == ["high", "debug", "normal"]


def test_the_openapi_schema_and_docs_are_served_locally(alice: Any, client: Client) -> None:
    client.force_login(alice)
    schema = client.get("/api/schema/?format=json")
    assert schema.status_code == 200
    assert "/api/v1/jobs/{id}/cancel/" in json.loads(schema.content)["paths"]
    docs = client.get("/api/docs/").content.decode()
    assert "drf_spectacular_sidecar" in docs or "/static/" in docs
    assert "cdn" not in docs.lower()


def test_pages_hide_other_members_jobs_and_show_the_queue(
    client: Client, alice: Any, charlie: Any, cluster: Any, image: Any
) -> None:
    job = submit(alice, command="python secret_project.py")
    client.force_login(charlie)
    assert client.get(reverse("job_detail", args=[job.pk])).status_code == 404
    assert client.post(reverse("job_cancel", args=[job.pk])).status_code == 404
    queue_html = client.get(reverse("queue_overview")).content.decode()
    assert "alice" in queue_html and "secret_project" not in queue_html


def test_the_submit_page_shows_a_refusal_without_losing_the_input(
    client: Client, alice: Any, cluster: Any, image: Any
) -> None:
    client.force_login(alice)
    response = client.post(
        reverse("job_submit"),
        {
            "queue": "debug",
            "image": "labportal/busybox:test",
            "command": "python long.py",
            "gpus": 1,
            "time_limit_hours": "5",
            "cpus": "4",
            "memory_gb": "16",
        },
    )
    assert response.status_code == 400
    html = response.content.decode()
    assert "The debug queue allows a time limit of at most 1 h" in html
    assert "python long.py" in html
    assert not Job.objects.exists()


def test_the_submit_page_queues_a_job_and_shows_it(
    client: Client, alice: Any, cluster: Any, image: Any
) -> None:
    client.force_login(alice)
    response = client.post(
        reverse("job_submit"),
        {
            "queue": "normal",
            "image": "labportal/busybox:test",
            "command": "echo hello",
            "gpus": 1,
            "cpus": "2",
            "memory_gb": "8",
            "env": "A=1\nB=two",
        },
    )
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse(
        "job_detail", args=[job.pk]
    )
    assert job.env == {"A": "1", "B": "two"}
    assert "echo hello" in client.get(response["Location"]).content.decode()


def test_a_batch_queues_every_job_in_one_request(alice: Any, cluster: Any, image: Any) -> None:
    jobs = [
        {
            "image": "labportal/busybox:test",
            "command": ["python", "sweep.py", f"--lr={lr}"],
            "gpus": 1,
        }
        for lr in (0.1, 0.01, 0.001)
    ]
    response = api_as(alice).post("/api/jobs/batch/", {"jobs": jobs}, format="json")
    assert response.status_code == 201, response.content
    created = body(response)
    assert [j["command"][-1] for j in created] == ["--lr=0.1", "--lr=0.01", "--lr=0.001"]
    assert Job.objects.filter(owner=alice, state=Job.State.PENDING).count() == 3


def test_a_batch_asks_for_one_scheduling_pass_not_one_per_job(
    alice: Any,
    cluster: Any,
    image: Any,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    from scheduling import tasks

    enqueued: list[int] = []
    monkeypatch.setattr(tasks.scheduling_pass_task, "apply_async", lambda: enqueued.append(1))
    jobs = [{"image": "labportal/busybox:test", "command": ["true"], "gpus": 1}] * 20
    with (
        CaptureQueriesContext(connection) as queries,
        django_capture_on_commit_callbacks(execute=True),
    ):
        response = api_as(alice).post("/api/jobs/batch/", {"jobs": jobs}, format="json")

    assert response.status_code == 201, response.content
    assert enqueued == [1]
    # One claim of the request flag (on SQLite up to three statements: the row's first
    # get_or_create), not one per job.
    claims = [q for q in queries.captured_queries if "main:requests" in q["sql"]]
    assert 1 <= len(claims) <= 3


def test_a_batch_with_one_bad_job_queues_none_and_names_the_job(
    alice: Any, cluster: Any, image: Any
) -> None:
    jobs = [
        {"image": "labportal/busybox:test", "command": ["echo", "ok"]},
        {"image": "labportal/busybox:test", "command": ["echo", "too big"], "gpus": 6},
    ]
    response = api_as(alice).post("/api/jobs/batch/", {"jobs": jobs}, format="json")
    assert response.status_code == 400
    assert body(response)["detail"].startswith("Job 2 of 2: No node has 6 matching GPUs")
    assert not Job.objects.exists()


def test_an_empty_or_oversized_batch_is_refused_with_the_limit(
    alice: Any, cluster: Any, image: Any
) -> None:
    api = api_as(alice)
    assert api.post("/api/jobs/batch/", {"jobs": []}, format="json").status_code == 400
    many = [{"image": "labportal/busybox:test", "command": ["true"]}] * 501
    alice.category.max_queued_jobs = 1000
    alice.category.save()
    response = api.post("/api/jobs/batch/", {"jobs": many}, format="json")
    assert response.status_code == 400
    # Counted before any job is validated, and named by its field.
    assert body(response) == {
        "jobs": {
            "non_field_errors": ["A batch holds at most 500 jobs; split it into smaller batches."]
        }
    }
    assert not Job.objects.exists()


def test_the_queue_page_shows_waiting_jobs_a_page_at_a_time_in_constant_queries(
    client: Client, alice: Any, cluster: Any, image: Any
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobqueue.models import Allocation, Job
    from jobqueue.views import QUEUE_PAGE_SIZE

    for gpu in cluster[0].gpus.all():  # every GPU of one node runs a job
        job = submit(alice)
        Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING, node=cluster[0])
        Allocation.objects.create(job=job, gpu=gpu)
    Job.objects.bulk_create(
        [
            Job(owner=alice, queue=job.queue, image=image, command=["true"], time_limit_s=60)
            for _ in range(QUEUE_PAGE_SIZE + 5)
        ]
    )
    client.force_login(alice)
    with CaptureQueriesContext(connection) as first:
        page1 = client.get(reverse("queue_overview")).content.decode()
    page2 = client.get(reverse("queue_overview"), {"page": 2}).content.decode()

    assert f"Showing 1–{QUEUE_PAGE_SIZE} of {QUEUE_PAGE_SIZE + 5}" in page1
    assert f"Showing {QUEUE_PAGE_SIZE + 1}–{QUEUE_PAGE_SIZE + 5} of" in page2
    assert page1.count("gpu01/gpu") == 4  # the running jobs' GPUs, with their node's name
    assert len(first.captured_queries) <= 12  # not one per allocation
    assert client.get(reverse("queue_overview"), {"page": "x"}).status_code == 200


def test_the_overview_api_gives_a_slice_of_the_waiting_and_how_many_wait(
    alice: Any, cluster: Any, image: Any
) -> None:
    jobs = [submit(alice) for _ in range(5)]
    api = api_as(alice)

    sliced = body(api.get("/api/queues/overview/", {"limit": 2, "offset": 1}))
    assert sliced["waiting_total"] == 5
    assert [e["id"] for e in sliced["waiting"]] == [j.pk for j in jobs[1:3]]
    refused = api.get("/api/queues/overview/", {"limit": "lots"})
    assert refused.status_code == 400 and "from 1 to 5000" in json.dumps(body(refused))

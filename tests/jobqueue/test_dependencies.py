"""Job dependencies (Slurm's afterok / afterany): refused at submit when they cannot be
met, given by the API in Slurm's syntax, held by the scheduling pass, and an afterok
whose dependency failed cancelled with the end reason dependency_failed."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from accounts.models import Notification
from jobqueue.errors import JobRefused
from jobqueue.models import Job
from scheduling.agent_events import job_event_apply
from scheduling.passes import scheduling_pass
from tests.conftest import api_as
from tests.jobqueue.test_lifecycle import dispatched, event, node_name
from tests.jobqueue.test_submit import submit

pytestmark = pytest.mark.django_db


def _run_pass(capture: Any) -> None:
    with capture(execute=True):
        scheduling_pass()


def _exit(job: Job, code: int, capture: Any) -> None:
    with capture(execute=True):
        job_event_apply(node_name=node_name(job), event=event(job, "started"))
        job_event_apply(node_name=node_name(job), event=event(job, "exited", exit_code=code))
    job.refresh_from_db()


# --- Submit -------------------------------------------------------------------


def test_a_job_stores_its_dependencies_and_kind(alice: Any, cluster: Any, image: Any) -> None:
    a = submit(alice)
    b = submit(alice, depends_on=[a.pk], dependency="afterany")
    b.refresh_from_db()
    assert list(b.depends_on.all()) == [a]
    assert b.dependency_kind == "afterany"
    assert submit(alice).dependency_kind == ""


def test_someone_elses_or_an_unknown_job_is_refused(
    alice: Any, bob: Any, admin_user: Any, cluster: Any, image: Any
) -> None:
    theirs = submit(bob)
    with pytest.raises(JobRefused, match=rf"no job {theirs.pk} of yours"):
        submit(alice, depends_on=[theirs.pk])
    with pytest.raises(JobRefused, match="no job 999999 of yours"):
        submit(alice, depends_on=[999999])
    # Staff may chain anyone's jobs.
    assert submit(admin_user, depends_on=[theirs.pk]).depends_on.count() == 1


def test_too_many_dependencies_and_a_bad_kind_are_refused(
    alice: Any, cluster: Any, image: Any
) -> None:
    a = submit(alice)
    with pytest.raises(JobRefused, match="at most 64 jobs; this one names 65"):
        submit(alice, depends_on=range(1, 66))
    with pytest.raises(JobRefused, match="use afterok or afterany"):
        submit(alice, depends_on=[a.pk], dependency="afterwhatever")


def test_afterok_on_a_job_that_already_failed_is_refused_and_afterany_is_not(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    a = dispatched(alice, django_capture_on_commit_callbacks)
    _exit(a, 1, django_capture_on_commit_callbacks)
    assert a.state == Job.State.FAILED
    with pytest.raises(JobRefused, match=rf"Job {a.pk} has already ended without completing"):
        submit(alice, depends_on=[a.pk])
    assert submit(alice, depends_on=[a.pk], dependency="afterany").pk


# --- API ----------------------------------------------------------------------


def _api_payload(**extra: Any) -> dict[str, Any]:
    return {"image": "labportal/busybox:test", "command": "python train.py", **extra}


def test_the_api_takes_slurms_syntax_and_shows_it_back(
    alice: Any, cluster: Any, image: Any
) -> None:
    a, b = submit(alice), submit(alice)
    client = api_as(alice)
    response = client.post(
        "/api/jobs/", _api_payload(dependency=f"afterok:{b.pk}:{a.pk}"), format="json"
    )
    assert response.status_code == 201, response.json()
    assert response.json()["dependency"] == f"afterok:{a.pk}:{b.pk}"
    job = Job.objects.get(pk=response.json()["id"])
    assert set(job.depends_on.all()) == {a, b} and job.dependency_kind == "afterok"
    read = client.get(f"/api/jobs/{a.pk}/").json()
    assert read["dependency"] is None
    assert client.get(f"/api/jobs/{job.pk}/").json()["dependency"] == f"afterok:{a.pk}:{b.pk}"


@pytest.mark.parametrize("text", ["after:1", "afterok", "afterok:", "afterok:x", "12"])
def test_the_api_refuses_bad_syntax_clearly(
    alice: Any, cluster: Any, image: Any, text: str
) -> None:
    response = api_as(alice).post("/api/jobs/", _api_payload(dependency=text), format="json")
    assert response.status_code == 400
    assert "is not a dependency: write afterok:12:13" in str(response.json())


def test_the_api_refuses_someone_elses_job(alice: Any, bob: Any, cluster: Any, image: Any) -> None:
    theirs = submit(bob)
    response = api_as(alice).post(
        "/api/jobs/", _api_payload(dependency=f"afterany:{theirs.pk}"), format="json"
    )
    assert response.status_code == 400
    assert "of yours" in str(response.json())


def test_the_schema_documents_the_field(admin_user: Any) -> None:
    from jobqueue.serializers import JobSubmitSerializer

    help_text = str(JobSubmitSerializer().fields["dependency"].help_text)
    assert "afterok:12:13" in help_text and "afterany:12" in help_text


# --- The pass -----------------------------------------------------------------


def test_the_pass_keeps_b_waiting_while_a_runs_and_dispatches_it_after_a_completes(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    capture = django_capture_on_commit_callbacks
    a = dispatched(alice, capture)
    b = submit(alice, depends_on=[a.pk])
    _run_pass(capture)
    b.refresh_from_db()
    assert b.state == Job.State.PENDING  # GPUs are free: only A keeps it waiting
    assert b.pending_reason == "dependency"
    assert b.pending_reason_text == f"Waiting for job {a.pk}."
    _exit(a, 0, capture)
    assert a.state == Job.State.COMPLETED
    _run_pass(capture)
    b.refresh_from_db()
    assert b.state == Job.State.DISPATCHED


def test_the_queue_page_says_what_b_waits_for(
    alice: Any, cluster: Any, image: Any, client: Any, django_capture_on_commit_callbacks: Any
) -> None:
    capture = django_capture_on_commit_callbacks
    a = dispatched(alice, capture)
    b = submit(alice, depends_on=[a.pk])
    _run_pass(capture)
    client.force_login(alice)
    assert f"Waiting for job {a.pk}." in client.get(reverse("queue_overview")).content.decode()
    assert (
        f"Waiting for job {a.pk}."
        in client.get(reverse("job_detail", args=[b.pk])).content.decode()
    )


def test_afterany_runs_after_a_failure(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    capture = django_capture_on_commit_callbacks
    a = dispatched(alice, capture)
    b = submit(alice, depends_on=[a.pk], dependency="afterany")
    _exit(a, 2, capture)
    _run_pass(capture)
    b.refresh_from_db()
    assert b.state == Job.State.DISPATCHED


def test_afterok_after_a_failure_cancels_the_chain_with_the_reason(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    capture = django_capture_on_commit_callbacks
    a = dispatched(alice, capture)
    b = submit(alice, depends_on=[a.pk])
    c = submit(alice, depends_on=[b.pk])
    _exit(a, 1, capture)
    _run_pass(capture)
    for job, dependency in ((b, a), (c, b)):
        job.refresh_from_db()
        assert job.state == Job.State.CANCELLED
        assert job.end_reason == "dependency_failed"
        last = job.events.last()
        assert last is not None and last.kind == "cancelled"
        assert f"job #{dependency.pk}, which it waited for (afterok)" in last.text
    titles = list(
        Notification.objects.filter(user=alice, kind="job_cancelled").values_list(
            "title", flat=True
        )
    )
    assert any(f"#{b.pk}" in t for t in titles) and any(f"#{c.pk}" in t for t in titles)


def test_a_cancelled_dependency_cancels_an_afterok_job(
    alice: Any, cluster: Any, image: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from jobqueue.services import job_cancel

    capture = django_capture_on_commit_callbacks
    a = submit(alice, gpus=4)
    b = submit(alice, depends_on=[a.pk])
    with capture(execute=True):
        job_cancel(job_id=a.pk, actor=alice)
    _run_pass(capture)  # the pass the cancel asked for
    b.refresh_from_db()
    assert b.state == Job.State.CANCELLED and b.end_reason == "dependency_failed"


# --- The web form -------------------------------------------------------------


def test_the_submit_form_takes_run_after(alice: Any, cluster: Any, image: Any, client: Any) -> None:
    a = submit(alice)
    client.force_login(alice)
    form = {
        "queue": "normal",
        "image": image.reference,
        "command": "python train.py",
        "gpus": 1,
        "cpus": "4",
        "memory_gb": 16,
        "run_after": f"afterok:{a.pk}",
    }
    page = client.get(reverse("job_submit")).content.decode()
    assert "Run after" in page
    response = client.post(reverse("job_submit"), form)
    assert response.status_code == 302, response.content.decode()[:2000]
    job = Job.objects.exclude(pk=a.pk).get()
    assert list(job.depends_on.all()) == [a] and job.dependency_kind == "afterok"
    bad = client.post(reverse("job_submit"), {**form, "run_after": "after:1"})
    assert "is not a dependency" in bad.content.decode()


def test_the_job_page_says_what_it_runs_after(
    alice: Any, cluster: Any, image: Any, client: Any
) -> None:
    a = submit(alice)
    b = submit(alice, depends_on=[a.pk], dependency="afterok")
    client.force_login(alice)
    page = client.get(reverse("job_detail", args=[b.pk])).content.decode()
    assert "Runs after" in page and "have completed successfully" in page
    assert f'href="{reverse("job_detail", args=[a.pk])}">#{a.pk}</a>' in page
    # A job that waits for nothing says nothing of it.
    assert "Runs after" not in client.get(reverse("job_detail", args=[a.pk])).content.decode()

"""Charging jobs to a project (a PI's grant, a shared project): who may, what a refusal
says, the submit form, the API and resubmits, and the usage report's per-project table.
alice is in the project, bob leads it (PI), charlie is an outsider."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.test import Client
from django.utils import translation

from accounts.models import Project
from jobqueue.errors import JobRefused
from jobqueue.models import Job
from jobqueue.resubmit import job_submit_again
from jobqueue.submit import job_submit
from reports.periods import period_of
from reports.selectors import usage_report
from reports.tables import report_tables
from tests.conftest import api_as
from tests.reports.conftest import MONDAY, NOW

pytestmark = pytest.mark.django_db

IMAGE = "labportal/busybox:test"


@pytest.fixture
def grant(alice: Any, bob: Any) -> Project:
    project = Project.objects.create(
        name="nsfc-vision",
        title="Vision grant",
        title_zh_hans="视觉基金项目",
        pi=bob,
        grant_reference="NSFC 62276001",
    )
    project.members.add(alice)
    return project


def _submit(owner: Any, **extra: Any) -> Job:
    return job_submit(owner=owner, queue="normal", image=IMAGE, command=["true"], **extra)


def test_a_member_and_the_pi_charge_jobs_to_the_project(
    grant: Project, alice: Any, bob: Any, cluster: Any, image: Any
) -> None:
    assert _submit(alice, project="nsfc-vision").project == grant
    assert _submit(bob, project="nsfc-vision").project == grant  # the PI, not in members
    assert _submit(alice).project is None  # a project is optional


def test_an_outsider_is_refused_with_whom_to_ask_and_no_job_is_queued(
    grant: Project, charlie: Any, cluster: Any, image: Any
) -> None:
    with pytest.raises(JobRefused) as refused:
        _submit(charlie, project="nsfc-vision")
    message = str(refused.value.message)
    assert "not a member of the project “nsfc-vision”" in message
    assert "ask its PI or a lab admin" in message
    assert "You belong to no project: leave the project empty." in message
    assert not Job.objects.exists()


def test_an_unknown_or_ended_project_is_refused_naming_the_members_projects(
    grant: Project, alice: Any, cluster: Any, image: Any
) -> None:
    with pytest.raises(JobRefused) as refused:
        _submit(alice, project="nsfc-visoin")
    assert str(refused.value.message) == (
        "There is no project “nsfc-visoin”. Your projects: nsfc-vision."
    )
    Project.objects.create(name="old-grant", title="Old", pi=alice, active=False)
    with pytest.raises(JobRefused) as refused:
        _submit(alice, project="old-grant")
    assert "has ended and takes no new jobs" in str(refused.value.message)
    assert "Your projects: nsfc-vision." in str(refused.value.message)  # not the ended one


def test_the_refusal_reads_as_chinese_sentences_in_chinese(
    grant: Project, charlie: Any, cluster: Any, image: Any
) -> None:
    from tests.labportal.test_zh_typography import typography_faults

    with translation.override("zh-hans"), pytest.raises(JobRefused) as refused:
        _submit(charlie, project="nsfc-vision")
    message = str(refused.value.message)
    assert "nsfc-vision" in message and "not a member" not in message
    assert typography_faults(message) == []


def test_the_api_takes_and_shows_the_project_and_refuses_an_outsider_with_a_400(
    grant: Project, alice: Any, charlie: Any, cluster: Any, image: Any
) -> None:
    response = api_as(alice).post(
        "/api/v1/jobs/",
        {"image": IMAGE, "command": ["true"], "project": "nsfc-vision"},
        format="json",
    )
    assert response.status_code == 201, response.content
    job = json.loads(response.content)
    assert job["project"] == "nsfc-vision"
    assert json.loads(api_as(alice).get(f"/api/v1/jobs/{job['id']}/").content)["project"] == (
        "nsfc-vision"
    )

    refused = api_as(charlie).post(
        "/api/v1/jobs/",
        {"image": IMAGE, "command": ["true"], "project": "nsfc-vision"},
        format="json",
    )
    assert refused.status_code == 400
    assert "not a member" in refused.content.decode()


def test_the_submit_form_offers_only_the_members_own_projects(
    grant: Project, alice: Any, charlie: Any, cluster: Any, image: Any
) -> None:
    Project.objects.create(name="other-lab", title="Another project")
    client = Client()
    client.force_login(alice)
    page = client.get("/jobs/submit/").content.decode()
    assert 'name="project"' in page
    assert "nsfc-vision · Vision grant" in page and "other-lab" not in page

    client.force_login(charlie)
    assert 'name="project"' not in client.get("/jobs/submit/").content.decode()


def test_the_submit_form_charges_the_chosen_project(
    grant: Project, alice: Any, cluster: Any, image: Any
) -> None:
    client = Client()
    client.force_login(alice)
    response = client.post(
        "/jobs/submit/",
        {
            "queue": "normal",
            "image": IMAGE,
            "command": "python train.py",
            "gpus": 1,
            "cpus": 4,
            "memory_gb": 16,
            "project": "nsfc-vision",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    job = Job.objects.get()
    assert job.project == grant
    detail = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'data-testid="job-project"' in detail and "Vision grant" in detail


def test_a_resubmit_keeps_the_project_only_for_who_may_charge_it(
    grant: Project, alice: Any, admin_user: Any, cluster: Any, image: Any
) -> None:
    job = _submit(alice, project="nsfc-vision")
    assert job_submit_again(job=job, actor=alice).project == grant
    assert job_submit_again(job=job, actor=admin_user).project is None


def test_the_usage_report_has_a_table_per_project(
    grant: Project, alice: Any, bob: Any, admin_user: Any, queues: Any
) -> None:
    from tests.factories import GpuFactory, NodeFactory
    from tests.reports.conftest import at, make_job

    node = NodeFactory.create(name="gpu01")
    gpus = [GpuFactory.create(node=node, index=i, uuid=f"GPU-p{i}", model="A100") for i in range(2)]
    period = period_of("custom", MONDAY.date(), MONDAY.date() + dt.timedelta(days=6))
    make_job(alice, "normal", gpus, at(0, 0), at(0, 0), at(0, 10), "completed", project=grant)
    make_job(bob, "normal", gpus[:1], at(1, 0), at(1, 0), at(1, 4), "completed")

    report = usage_report(period=period, viewer=admin_user, now=NOW)
    lines = {line.name: line for line in report.tables["project"]}
    assert lines["nsfc-vision"].gpu_hours == pytest.approx(20)
    assert lines["—"].gpu_hours == pytest.approx(4)
    table = next(t for t in report_tables(report) if t.slug == "project")
    assert "“—” is the work charged to no project." in table.note

    # A member sees the lab-wide project table too, as the queue table.
    assert "project" in usage_report(period=period, viewer=alice, now=NOW).tables


def test_no_project_table_while_no_job_is_charged_to_one(
    alice: Any, admin_user: Any, queues: Any
) -> None:
    from tests.factories import GpuFactory, NodeFactory
    from tests.reports.conftest import at, make_job

    gpu = GpuFactory.create(node=NodeFactory.create(name="gpu01"), uuid="GPU-q0")
    make_job(alice, "normal", [gpu], at(0, 0), at(0, 0), at(0, 2), "completed")
    period = period_of("custom", MONDAY.date(), MONDAY.date() + dt.timedelta(days=6))
    report = usage_report(period=period, viewer=admin_user, now=NOW)
    assert "project" not in [t.slug for t in report_tables(report)]

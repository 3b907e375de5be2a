"""The job's life is one table (Job.TRANSITIONS) that every service goes through, and the
admin changes jobs only through the services."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from jobqueue import errors
from jobqueue.models import Job
from tests.architecture import importgraph
from tests.conftest import PASSWORD
from tests.jobqueue.test_submit import submit

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ["jobqueue", "scheduling", "slurm", "credits", "approvals", "reservations", "alerts"]

S = Job.State


def test_the_table_names_every_state_and_finals_are_final() -> None:
    assert set(Job.TRANSITIONS) == set(S.values)
    for final in Job.FINAL_STATES:
        assert Job.TRANSITIONS[final] == frozenset()
    for state in (*Job.WAITING_STATES, *Job.ACTIVE_STATES):
        # A job that has not ended can always end, in any of the ways a job ends.
        assert set(Job.FINAL_STATES) <= Job.TRANSITIONS[state], state
    assert S.DISPATCHED not in Job.TRANSITIONS[S.HELD]  # a held job is released first
    assert S.HELD not in Job.TRANSITIONS[S.RUNNING]


@pytest.mark.parametrize(
    ("start", "to", "allowed"),
    [
        (S.PENDING, S.DISPATCHED, True),
        (S.DISPATCHED, S.RUNNING, True),
        (S.RUNNING, S.PENDING, True),  # preempted, back in the queue
        (S.RUNNING, S.COMPLETED, True),
        (S.HELD, S.PENDING, True),
        (S.HELD, S.DISPATCHED, False),
        (S.COMPLETED, S.PENDING, False),
        (S.LOST, S.RUNNING, False),
        (S.CANCELLED, S.COMPLETED, False),
    ],
)
def test_move_to_follows_the_table(start: str, to: str, allowed: bool) -> None:
    job = Job(state=start)
    if allowed:
        job.move_to(to)
        assert job.state == to
    else:
        with pytest.raises(errors.InvalidTransition):
            job.move_to(to)
        assert job.state == start


def test_staying_in_a_state_is_no_move() -> None:
    job = Job(state=S.COMPLETED)
    job.move_to(S.COMPLETED)
    assert job.state == S.COMPLETED


def test_no_service_sets_a_job_state_by_hand() -> None:
    """Every `<job>.state = ...` in the product is Job.move_to's own; the rest call it."""
    offenders = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            tree = importgraph.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                targets = node.targets if isinstance(node, ast.Assign) else []
                for target in targets:
                    if (
                        isinstance(target, ast.Attribute)
                        and target.attr == "state"
                        and isinstance(target.value, ast.Name)
                        and target.value.id in {"job", "j"}
                    ):
                        offenders.append(f"{path.relative_to(ROOT)}:{target.lineno}")
    assert offenders == [], offenders


@pytest.fixture
def admin_client(admin_user: Any) -> Client:
    admin_user.set_password(PASSWORD)
    admin_user.save()
    client = Client()
    assert client.login(username=admin_user.username, password=PASSWORD)
    return client


@pytest.mark.django_db
def test_the_admin_edits_no_job_field_adds_none_and_deletes_none(
    alice: Any, admin_client: Client, cluster: Any, image: Any
) -> None:
    client = admin_client
    job = submit(alice)

    page = client.get(reverse("admin:jobqueue_job_change", args=[job.pk]))
    assert page.status_code == 200
    form = page.content.decode()
    for field in ("state", "owner", "node", "command", "queue", "gpus"):
        assert f'name="{field}"' not in form, field

    # A forged POST of the change form changes nothing either.
    client.post(
        reverse("admin:jobqueue_job_change", args=[job.pk]),
        {"state": S.COMPLETED, "command": '["rm", "-rf", "/"]', "gpus": 8},
    )
    job.refresh_from_db()
    assert (job.state, job.gpus) == (S.PENDING, 1)
    assert job.command == ["/bin/sh", "-c", "python train.py --epochs 3"]

    assert client.get(reverse("admin:jobqueue_job_add")).status_code == 403
    assert client.get(reverse("admin:jobqueue_job_delete", args=[job.pk])).status_code == 403
    assert Job.objects.filter(pk=job.pk).exists()


@pytest.mark.django_db
def test_the_admin_cancels_through_the_service(
    alice: Any, admin_user: Any, admin_client: Client, cluster: Any, image: Any
) -> None:
    job = submit(alice)
    admin_client.post(
        reverse("admin:jobqueue_job_changelist"),
        {"action": "cancel_jobs", "_selected_action": [job.pk]},
    )
    job.refresh_from_db()
    assert job.state == S.CANCELLED
    # The service's audit trail, not a bare field edit.
    assert [e.kind for e in job.events.all()][-1] == "cancelled"
    assert job.events.get(kind="cancelled").actor == admin_user

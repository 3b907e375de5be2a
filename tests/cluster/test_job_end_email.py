"""A job's end is emailed by its own task: the agent's event is handled without waiting for mail."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import mail

from accounts.models import Notification
from accounts.tasks import notification_email_task
from scheduling.tasks import job_event
from tests.cluster.conftest import job_on
from tests.cluster.test_job_reports import an_event

pytestmark = pytest.mark.django_db


def test_a_job_end_is_emailed_by_its_own_task_once_however_often_it_runs(
    registered_node: Any,
    alice: Any,
    sent_tasks: Any,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    def enqueue_only(args: Any = None, **_k: Any) -> None:  # no worker runs it yet
        sent_tasks.append(("control.notification_email", list(args or []), "control"))

    monkeypatch.setattr(notification_email_task, "apply_async", enqueue_only)
    node, secret = registered_node
    job = job_on(node, alice)

    with django_capture_on_commit_callbacks(execute=True):
        assert job_event("gpu01", secret, an_event(job.pk, "exited", exit_code=0, ts=None)) == "ok"

    assert mail.outbox == []  # the event task did not send it
    [(_name, [note_id], queue)] = sent_tasks.named("control.notification_email")
    assert queue == "control"
    note = Notification.objects.get(pk=note_id)
    assert note.user == alice and note.kind == "job_completed" and note.emailed_at is None

    notification_email_task(note_id)
    notification_email_task(note_id)  # redelivered: already emailed, not sent again

    assert [m.to for m in mail.outbox] == [["alice@lab.example"]]
    assert f"#{job.pk}" in mail.outbox[0].subject
    note.refresh_from_db()
    assert note.emailed_at is not None

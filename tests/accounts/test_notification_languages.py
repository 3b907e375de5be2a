"""A notification is stored as what to say and read in the reader's language at read time:
one created while the member read English reads in Chinese after they switch, and its
email goes out in the recipient's language. Rows stored as words read as written."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core import mail
from django.utils.translation import gettext_noop

from accounts.models import Notification
from accounts.services import notify
from core.durations import lazy_hours_minutes
from core.i18n import lazy_text
from tests.conftest import PASSWORD, api_as

pytestmark = pytest.mark.django_db


def _job_end_note(user: Any) -> Notification:
    return notify(
        user=user,
        kind="job_completed",
        title=lazy_text(gettext_noop("Job #%(id)s completed"), id=507),
        body=lazy_text(
            gettext_noop("Job #%(id)s (%(name)s) completed after %(duration)s."),
            id=507,
            name="train",
            duration=lazy_hours_minutes(timedelta(hours=2, minutes=5)),
        ),
        email=False,
    )


def test_a_notification_written_in_english_reads_in_chinese_after_the_switch(
    client: Any, alice: Any
) -> None:
    alice.preferred_language = "en"
    alice.save()
    note = _job_end_note(alice)
    assert note.title == "Job #507 completed"
    client.login(username="alice", password=PASSWORD)
    client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/"})
    alice.refresh_from_db()
    assert alice.preferred_language == "zh-hans"
    page = client.get("/account/notifications/").content.decode()
    assert "作业 #507 已完成" in page and "Job #507" not in page and "completed after" not in page
    api = api_as(alice).get("/api/notifications/", HTTP_ACCEPT_LANGUAGE="zh-hans").json()
    rows = api["results"] if isinstance(api, dict) else api
    assert rows[0]["title"] == "作业 #507 已完成"


def test_a_row_stored_as_words_reads_as_written(client: Any, alice: Any) -> None:
    Notification.objects.create(user=alice, kind="old", title="Job #12 completed", body="As is.")
    client.login(username="alice", password=PASSWORD)
    page = client.get("/account/notifications/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "Job #12 completed" in page and "As is." in page


def test_the_email_goes_out_in_the_recipients_language_when_sent(
    alice: Any, django_capture_on_commit_callbacks: Any
) -> None:
    alice.preferred_language = "en"
    alice.save()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        notify(
            user=alice,
            kind="credits_grant",
            title=lazy_text(gettext_noop("Your monthly credits have arrived")),
        )
    alice.preferred_language = "zh-hans"
    alice.save()
    for callback in callbacks:
        callback()
    assert mail.outbox[0].subject == "[LabPortal] 本月积分已到账"

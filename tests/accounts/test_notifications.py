"""Notifications: the bell with its unread count, the list, marking read, email on commit, the API."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import mail

from accounts.models import Notification
from accounts.services import notify
from tests.conftest import PASSWORD, api_as

pytestmark = pytest.mark.django_db


def test_a_notification_is_emailed_once_the_transaction_commits(
    alice: Any, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        notify(user=alice, kind="test", title="Hello", body="World", url="/account/credits/")
    assert mail.outbox == []
    for callback in callbacks:
        callback()
    assert [m.subject for m in mail.outbox] == ["[LabPortal] Hello"]
    assert Notification.objects.get().emailed_at is not None


def test_email_false_keeps_it_in_the_app_only(
    alice: Any, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        notify(user=alice, kind="test", title="Quiet", email=False)
    assert mail.outbox == []


def test_a_dedupe_key_notifies_once(alice: Any) -> None:
    first = notify(user=alice, kind="test", title="Once", dedupe_key="k")
    assert notify(user=alice, kind="test", title="Once", dedupe_key="k").pk == first.pk
    assert Notification.objects.count() == 1


def test_notifications_are_written_in_the_members_language(alice: Any) -> None:
    from django.utils.translation import gettext_lazy

    alice.preferred_language = "zh-hans"
    alice.save()
    note = notify(user=alice, kind="test", title=gettext_lazy("Credits"))
    assert note.title == "积分"


def test_the_bell_shows_the_unread_count_and_refreshes_itself(client: Any, alice: Any) -> None:
    notify(user=alice, kind="test", title="One")
    notify(user=alice, kind="test", title="Two")
    client.login(username="alice", password=PASSWORD)
    page = client.get("/account/notifications/").content.decode()
    assert 'data-testid="bell-count">2<' in page
    assert 'hx-get="/account/notifications/bell/"' in page
    assert (
        'data-testid="bell-count">2<' in client.get("/account/notifications/bell/").content.decode()
    )


def test_marking_read_empties_the_bell(client: Any, alice: Any) -> None:
    note = notify(user=alice, kind="test", title="One", url="/account/credits/")
    notify(user=alice, kind="test", title="Two")
    client.login(username="alice", password=PASSWORD)
    response = client.post("/account/notifications/read/", {"id": note.pk})
    assert response.status_code == 302 and response["Location"] == "/account/credits/"
    client.post("/account/notifications/read/")
    assert not Notification.objects.unread().exists()
    assert "bell-count" not in client.get("/account/notifications/bell/").content.decode()


def test_charlie_cannot_mark_alices_notification_read(
    client: Any, alice: Any, charlie: Any
) -> None:
    note = notify(user=alice, kind="test", title="Private")
    client.login(username="charlie", password=PASSWORD)
    assert client.post("/account/notifications/read/", {"id": note.pk}).status_code == 404
    assert client.post("/account/notifications/read/", {"id": "abc"}).status_code == 302
    note.refresh_from_db()
    assert note.read_at is None
    assert "Private" not in client.get("/account/notifications/").content.decode()


def test_the_api_lists_only_your_own_notifications_and_marks_them_read(
    alice: Any, charlie: Any, admin_user: Any
) -> None:
    note = notify(user=alice, kind="test", title="For alice")
    assert api_as(charlie).get("/api/notifications/").json()["results"] == []
    assert api_as(admin_user).get(f"/api/notifications/{note.pk}/").status_code == 404
    assert api_as(charlie).post(f"/api/notifications/{note.pk}/read/").status_code == 404
    client = api_as(alice)
    assert [
        n["title"] for n in client.get("/api/notifications/?unread=true").json()["results"]
    ] == ["For alice"]
    assert client.post(f"/api/notifications/{note.pk}/read/").json()["read_at"] is not None
    notify(user=alice, kind="test", title="Another")
    assert client.post("/api/notifications/read-all/").json() == {"marked_read": 1}


def test_the_email_is_sent_at_once_when_the_broker_cannot_take_its_task(
    alice: Any, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    from kombu.exceptions import OperationalError

    from accounts.tasks import notification_email_task

    def broker_away(*_a: Any, **_k: Any) -> None:
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(notification_email_task, "apply_async", broker_away)
    with django_capture_on_commit_callbacks(execute=True):
        notify(user=alice, kind="test", title="Hello", body="World")

    assert [m.subject for m in mail.outbox] == ["[LabPortal] Hello"]
    assert Notification.objects.get().emailed_at is not None

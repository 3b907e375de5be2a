"""The staff alerts page with acknowledge, the member's view on the job page, the API, email, languages."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core import mail

from accounts.models import Notification
from alerts.models import Alert, Kind
from cluster.models import Gpu
from tests.alerts.conftest import run_job, samples
from tests.conftest import PASSWORD, api_as

pytestmark = pytest.mark.django_db

MIN = timedelta(minutes=1)


@pytest.fixture
def idle_alert(cluster: Any, alice: Any, admin_user: Any, t0: Any, evaluate: Any) -> Alert:
    gpu = Gpu.objects.filter(node=cluster[0]).order_by("index").first()
    assert gpu is not None
    run_job(alice, [gpu], started=t0 - 40 * MIN)
    samples(gpu, start=t0 - 35 * MIN, end=t0, util=1.0)
    evaluate(t0)
    return Alert.objects.get(kind=Kind.IDLE_JOB)


def test_staff_see_open_alerts_and_acknowledge_them(
    client: Any, admin_user: Any, idle_alert: Alert
) -> None:
    client.force_login(admin_user)
    page = client.get("/alerts/").content.decode()
    assert f'data-testid="alert-{idle_alert.pk}"' in page
    assert f"Job #{idle_alert.job_id} has kept its GPUs under 5% utilisation" in page
    response = client.post(f"/alerts/{idle_alert.pk}/acknowledge/")
    assert response.status_code == 302
    idle_alert.refresh_from_db()
    assert idle_alert.state == Alert.State.ACKNOWLEDGED
    assert idle_alert.acknowledged_by == admin_user
    assert "Acknowledged by admin" in client.get("/alerts/").content.decode()
    # Acknowledging twice changes nothing; a resolved alert cannot be acknowledged.
    client.post(f"/alerts/{idle_alert.pk}/acknowledge/")
    assert list(idle_alert.events.values_list("kind", flat=True)) == ["fired", "acknowledged"]


def test_a_member_sees_only_the_alerts_about_their_own_jobs_and_cannot_acknowledge(
    client: Any, alice: Any, charlie: Any, idle_alert: Alert
) -> None:
    client.login(username="charlie", password=PASSWORD)
    page = client.get("/alerts/")
    # Not a 403 that speaks of deciding on requests: the member's own (empty) list.
    assert page.status_code == 200
    html = page.content.decode()
    assert "My alerts" in html and "Only lab admins can decide" not in html
    assert f'data-testid="alert-{idle_alert.pk}"' not in html
    assert client.post(f"/alerts/{idle_alert.pk}/acknowledge/").status_code == 403
    client.login(username="alice", password=PASSWORD)
    html = client.get("/alerts/").content.decode()
    assert f'data-testid="alert-{idle_alert.pk}"' in html
    assert f'data-testid="ack-{idle_alert.pk}"' not in html
    assert client.get("/alerts/?state=resolved").content.decode().count("alert-card") == 0
    client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/"})
    assert "我的告警" in client.get("/alerts/").content.decode()
    idle_alert.refresh_from_db()
    assert idle_alert.state == Alert.State.FIRING


def test_the_owner_sees_the_idle_warning_on_the_job_page_and_others_do_not(
    client: Any, alice: Any, charlie: Any, idle_alert: Alert
) -> None:
    client.login(username="alice", password=PASSWORD)
    page = client.get(f"/jobs/{idle_alert.job_id}/").content.decode()
    assert 'data-testid="job-alerts"' in page
    assert "has kept its GPUs under 5% utilisation for 30 minutes" in page
    # Warn, never surprise: the time left and when the hard limit would stop it.
    assert 'data-testid="time-left"' in page and "Time limit in 23" in page
    assert "It will be stopped at" in page and "save a checkpoint" in page
    client.login(username="charlie", password=PASSWORD)
    assert client.get(f"/jobs/{idle_alert.job_id}/").status_code == 404


def test_the_owner_is_notified_and_emailed_in_their_language(
    cluster: Any, alice: Any, t0: Any, evaluate: Any
) -> None:
    alice.preferred_language = "zh-hans"
    alice.save()
    gpu = Gpu.objects.filter(node=cluster[0]).first()
    assert gpu is not None
    job = run_job(alice, [gpu], started=t0 - 40 * MIN)
    samples(gpu, start=t0 - 35 * MIN, end=t0, util=1.0)
    evaluate(t0)
    note = Notification.objects.get(user=alice, kind="alert_idle_job")
    assert f"作业 #{job.pk}" in note.title and "利用率" in note.title
    assert note.url == f"/jobs/{job.pk}/"
    assert len(mail.outbox) == 1 and mail.outbox[0].to == [alice.email]


def test_alert_texts_render_in_the_readers_language(idle_alert: Alert) -> None:
    from django.utils import translation

    with translation.override("zh-hans"):
        assert "利用率" in idle_alert.message
    with translation.override("en"):
        assert "utilisation" in idle_alert.message


def test_the_api_scopes_alerts_and_only_staff_acknowledge(
    alice: Any, charlie: Any, admin_user: Any, idle_alert: Alert
) -> None:
    assert [a["id"] for a in api_as(alice).get("/api/alerts/").json()["results"]] == [idle_alert.pk]
    assert api_as(charlie).get("/api/alerts/").json()["results"] == []
    assert api_as(charlie).get(f"/api/alerts/{idle_alert.pk}/").status_code == 404
    assert api_as(alice).post(f"/api/alerts/{idle_alert.pk}/acknowledge/").status_code == 403
    body = api_as(admin_user).post(f"/api/alerts/{idle_alert.pk}/acknowledge/").json()
    assert body["state"] == "acknowledged" and body["acknowledged_by"] == "admin"
    assert "utilisation" in body["message"]
    Alert.objects.filter(pk=idle_alert.pk).update(state=Alert.State.RESOLVED)
    refused = api_as(admin_user).post(f"/api/alerts/{idle_alert.pk}/acknowledge/")
    assert refused.status_code == 409 and "already resolved" in refused.json()["detail"]

"""The approvals API and pages: alice applies, charlie sees nothing of hers, only staff decide."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.urls import include, path
from django.utils import timezone

from jobqueue.models import EmergencyRequest, Job, PriorityGrant
from labportal.urls import urlpatterns as portal_urlpatterns
from tests.conftest import PASSWORD, api_as
from tests.factories import ContainerImageFactory, default_queue

# Until the includes are merged into jobqueue/urls.py and labportal/urls.py, mount them here.
urlpatterns = [
    path("jobs/", include("approvals.urls")),
    path("api/", include("approvals.api_urls")),
    *portal_urlpatterns,
]

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]


def grant_payload(**overrides: Any) -> dict[str, Any]:
    payload = {
        "reason": "Experiments for the ICML camera-ready",
        "gpus_expected": 4,
        "deadline": (timezone.now() + timedelta(days=5)).isoformat(),
    }
    payload.update(overrides)
    return payload


def waiting_job(owner: Any) -> Job:
    return Job.objects.create(
        owner=owner,
        queue=default_queue(),
        image=ContainerImageFactory.create(),
        command=["python", "t.py"],
        gpus=1,
        time_limit_s=3600,
    )


def test_a_member_applies_for_a_grant_through_the_api(alice: Any) -> None:
    response = api_as(alice).post("/api/grants/", grant_payload(), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["state"] == "pending" and response.json()["queue"] == "high"


def test_a_bad_grant_request_gets_a_clear_400(alice: Any) -> None:
    response = api_as(alice).post(
        "/api/grants/", grant_payload(deadline="next friday"), format="json"
    )
    assert response.status_code == 400 and "deadline" in response.json()
    response = api_as(alice).post("/api/grants/", grant_payload(reason="pls"), format="json")
    assert response.status_code == 400
    assert "Say in a sentence" in response.json()["detail"]


def test_charlie_cannot_see_or_decide_alices_grant(alice: Any, charlie: Any) -> None:
    grant_id = api_as(alice).post("/api/grants/", grant_payload(), format="json").json()["id"]
    client = api_as(charlie)
    assert client.get("/api/grants/").json()["results"] == []
    assert client.get(f"/api/grants/{grant_id}/").status_code == 404
    assert client.post(f"/api/grants/{grant_id}/approve/").status_code == 404
    assert client.post(f"/api/grants/{grant_id}/withdraw/").status_code == 404


def test_a_member_cannot_approve_their_own_grant(alice: Any) -> None:
    client = api_as(alice)
    grant_id = client.post("/api/grants/", grant_payload(), format="json").json()["id"]
    response = client.post(f"/api/grants/{grant_id}/approve/")
    assert response.status_code == 403 and response.json()["code"] == "staff_only"
    assert PriorityGrant.objects.get(pk=grant_id).state == "pending"


def test_staff_see_every_grant_and_approve_with_a_comment(
    alice: Any, bob: Any, admin_user: Any
) -> None:
    api_as(alice).post("/api/grants/", grant_payload(), format="json")
    api_as(bob).post("/api/grants/", grant_payload(), format="json")
    client = api_as(admin_user)
    pending = client.get("/api/grants/?state=pending").json()["results"]
    assert {g["username"] for g in pending} == {"alice", "bob"}
    response = client.post(
        f"/api/grants/{pending[0]['id']}/approve/", {"comment": "ok"}, format="json"
    )
    assert response.json()["state"] == "approved" and response.json()["in_force"] is True
    again = client.post(f"/api/grants/{pending[0]['id']}/reject/")
    assert again.status_code == 409 and again.json()["code"] == "already_decided"


def test_emergencies_through_the_api_show_the_uses_left_and_enforce_the_limit(
    alice: Any, charlie: Any, admin_user: Any
) -> None:
    from accounts.models import CreditPolicy

    CreditPolicy.objects.update_or_create(pk=1, defaults={"emergency_max_uses": 1})
    client = api_as(alice)
    assert client.get("/api/emergencies/uses-left/").json()["uses_left"] == 1
    job = waiting_job(alice)
    created = client.post(
        "/api/emergencies/", {"jobs": [job.pk], "reason": "Defence tomorrow morning"}, format="json"
    )
    assert created.status_code == 201, created.content
    request_id = created.json()["id"]
    assert api_as(charlie).get(f"/api/emergencies/{request_id}/").status_code == 404
    assert client.post(f"/api/emergencies/{request_id}/approve/").status_code == 403
    approved = api_as(admin_user).post(f"/api/emergencies/{request_id}/approve/").json()
    assert approved["state"] == "approved" and approved["expires_at"]
    refused = client.post(
        "/api/emergencies/",
        {"jobs": [waiting_job(alice).pk], "reason": "Another emergency!"},
        format="json",
    )
    assert refused.status_code == 429 and refused.json()["code"] == "emergency_limit_reached"
    assert EmergencyRequest.objects.count() == 1


def test_someone_elses_job_cannot_be_named_in_an_emergency(alice: Any, charlie: Any) -> None:
    response = api_as(charlie).post(
        "/api/emergencies/",
        {"jobs": [waiting_job(alice).pk], "reason": "Mine now, please"},
        format="json",
    )
    assert response.status_code == 400 and "not waiting jobs of yours" in response.json()["detail"]


def test_the_grant_form_sends_a_request_and_lists_it(client: Any, alice: Any) -> None:
    client.login(username="alice", password=PASSWORD)
    deadline = (timezone.localtime() + timedelta(days=3)).strftime("%Y-%m-%dT%H:%M")
    response = client.post(
        "/jobs/grants/apply/",
        {
            "reason": "Experiments for the ICML camera-ready",
            "deadline": deadline,
            "gpus_expected": 2,
        },
        follow=True,
    )
    assert response.status_code == 200
    assert PriorityGrant.objects.filter(user=alice, gpus_expected=2).exists()
    assert "pending" in response.content.decode()


def test_the_grant_form_shows_a_service_refusal_next_to_the_form(client: Any, alice: Any) -> None:
    client.login(username="alice", password=PASSWORD)
    past = (timezone.localtime() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    response = client.post(
        "/jobs/grants/apply/",
        {"reason": "Experiments for the ICML camera-ready", "deadline": past, "gpus_expected": 1},
    )
    assert response.status_code == 400
    assert "The deadline must be in the future." in response.content.decode()


def test_the_emergency_form_says_how_many_uses_remain(client: Any, alice: Any) -> None:
    waiting_job(alice)
    client.login(username="alice", password=PASSWORD)
    response = client.get("/jobs/emergencies/apply/")
    assert "You have 2 emergencies left (2 per 90 days)." in response.content.decode()


def test_only_staff_open_the_approvals_page_and_decide(
    client: Any, alice: Any, admin_user: Any
) -> None:
    grant = PriorityGrant.objects.create(
        user=alice,
        queue=default_queue("high"),
        reason="x" * 20,
        deadline=timezone.now() + timedelta(days=2),
    )
    client.login(username="alice", password=PASSWORD)
    assert client.get("/jobs/approvals/").status_code == 403
    assert (
        client.post(
            f"/jobs/approvals/grants/{grant.pk}/decide/", {"decision": "approve"}
        ).status_code
        == 403
    )
    client.login(username="admin", password=PASSWORD)
    page = client.get("/jobs/approvals/")
    assert page.status_code == 200 and "alice" in page.content.decode()
    client.post(
        f"/jobs/approvals/grants/{grant.pk}/decide/", {"decision": "approve", "comment": "fine"}
    )
    grant.refresh_from_db()
    assert (grant.state, grant.comment) == ("approved", "fine")


def test_a_decision_through_htmx_returns_the_updated_row(
    client: Any, alice: Any, admin_user: Any
) -> None:
    grant = PriorityGrant.objects.create(
        user=alice,
        queue=default_queue("high"),
        reason="x" * 20,
        deadline=timezone.now() + timedelta(days=2),
    )
    client.login(username="admin", password=PASSWORD)
    response = client.post(
        f"/jobs/approvals/grants/{grant.pk}/decide/", {"decision": "reject"}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    assert (
        f'data-grant="{grant.pk}"' in response.content.decode()
        and "rejected" in response.content.decode()
    )


def test_the_admin_actions_approve_and_reject(client: Any, alice: Any, admin_user: Any) -> None:
    grant = PriorityGrant.objects.create(
        user=alice,
        queue=default_queue("high"),
        reason="x" * 20,
        deadline=timezone.now() + timedelta(days=2),
    )
    client.login(username="admin", password=PASSWORD)
    client.post(
        "/admin/jobqueue/prioritygrant/", {"action": "approve", "_selected_action": [grant.pk]}
    )
    grant.refresh_from_db()
    assert grant.state == "approved" and grant.decided_by == admin_user

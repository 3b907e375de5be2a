"""The reservations API: what alice, bob, charlie and the admin may see and do."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from reservations.models import Reservation
from reservations.services import reservation_create
from tests.conftest import api_as
from tests.reservations.conftest import at

pytestmark = pytest.mark.django_db


def parse(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@pytest.fixture(autouse=True)
def _setup(contracts: Any, clock: Any) -> None:
    pass


@pytest.fixture
def alices(alice: Any, gpus: list[Any]) -> Reservation:
    return reservation_create(
        user=alice, gpu_ids=[gpus[0].pk], start=at(1), end=at(3), note="alice's"
    )


def test_anonymous_requests_are_refused(api: Any, alices: Reservation) -> None:
    assert api.get("/api/reservations/").status_code in (401, 403)
    assert api.post(f"/api/reservations/{alices.pk}/cancel/").status_code in (401, 403)


def test_alice_lists_her_bookings_and_charlie_sees_none(
    alice: Any, charlie: Any, alices: Reservation
) -> None:
    body = api_as(alice).get("/api/reservations/").json()
    assert [r["id"] for r in body["results"]] == [alices.pk]
    assert body["results"][0]["gpu_labels"] == ["gpu01/gpu0"]
    assert api_as(charlie).get("/api/reservations/").json()["results"] == []
    assert api_as(charlie).get(f"/api/reservations/{alices.pk}/").status_code == 404


def test_the_admin_sees_every_booking(admin_user: Any, alices: Reservation) -> None:
    assert [r["id"] for r in api_as(admin_user).get("/api/reservations/").json()["results"]] == [
        alices.pk
    ]


def test_alice_books_by_node_and_count(alice: Any, gpus: list[Any]) -> None:
    response = api_as(alice).post(
        "/api/reservations/",
        {"node": "gpu02", "gpu_count": 2, "start": at(1).isoformat(), "end": at(2).isoformat()},
        format="json",
    )
    assert response.status_code == 201, response.json()
    assert response.json()["gpu_labels"] == ["gpu02/gpu0", "gpu02/gpu1"]


def test_a_conflict_is_409_with_the_nearest_free_slot(
    bob: Any, gpus: list[Any], alices: Reservation
) -> None:
    response = api_as(bob).post(
        "/api/reservations/",
        {"gpus": [gpus[0].pk], "start": at(2).isoformat(), "end": at(4).isoformat()},
        format="json",
    )
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "reservation_conflict"
    assert parse(body["suggestion"]["start"]) == at(3)


def test_bad_input_is_400_and_says_what_to_do(alice: Any, gpus: list[Any]) -> None:
    response = api_as(alice).post(
        "/api/reservations/", {"start": at(1).isoformat(), "end": at(2).isoformat()}, format="json"
    )
    assert response.status_code == 400
    assert "gpu_count" in str(response.json())
    response = api_as(alice).post(
        "/api/reservations/",
        {"gpus": [gpus[0].pk], "start": at(1.1).isoformat(), "end": at(2).isoformat()},
        format="json",
    )
    assert response.status_code == 400 and response.json()["code"] == "booking_rule"


def test_members_cannot_book_maintenance_but_admins_can(
    alice: Any, admin_user: Any, gpus: list[Any]
) -> None:
    payload = {
        "gpus": [gpus[5].pk],
        "start": at(1).isoformat(),
        "end": at(2).isoformat(),
        "maintenance": True,
    }
    assert api_as(alice).post("/api/reservations/", payload, format="json").status_code == 403
    response = api_as(admin_user).post("/api/reservations/", payload, format="json")
    assert response.status_code == 201 and response.json()["is_maintenance"] is True


@pytest.mark.parametrize("verb", ["cancel", "release", "extend"])
def test_bob_and_charlie_cannot_act_on_alices_booking(
    verb: str, bob: Any, charlie: Any, alices: Reservation
) -> None:
    for outsider in (bob, charlie):
        response = api_as(outsider).post(
            f"/api/reservations/{alices.pk}/{verb}/", {"end": at(4).isoformat()}, format="json"
        )
        assert response.status_code == 404
    alices.refresh_from_db()
    assert alices.state == Reservation.State.BOOKED and alices.end == at(3)


def test_alice_cancels_extends_and_releases(
    alice: Any, alices: Reservation, gpus: list[Any], clock: Any
) -> None:
    client = api_as(alice)
    response = client.post(
        f"/api/reservations/{alices.pk}/extend/", {"end": at(4).isoformat()}, format="json"
    )
    assert response.status_code == 200 and parse(response.json()["end"]) == at(4)
    clock.move_to(at(2))
    response = client.post(f"/api/reservations/{alices.pk}/release/")
    assert response.json()["state"] == "released"
    assert client.post(f"/api/reservations/{alices.pk}/cancel/").status_code == 409
    other = reservation_create(user=alice, gpu_ids=[gpus[1].pk], start=at(5), end=at(6))
    assert client.post(f"/api/reservations/{other.pk}/cancel/").json()["state"] == "cancelled"


def test_the_admin_can_cancel_alices_booking(admin_user: Any, alices: Reservation) -> None:
    assert (
        api_as(admin_user).post(f"/api/reservations/{alices.pk}/cancel/").json()["state"]
        == "cancelled"
    )


def test_suggest_finds_the_earliest_slot_for_n_gpus_on_one_node(
    alice: Any, bob: Any, gpus: list[Any]
) -> None:
    for gpu in gpus[:3] + gpus[4:7]:
        reservation_create(
            user=bob if gpu.index % 2 else alice, gpu_ids=[gpu.pk], start=at(0), end=at(2)
        )
    body = api_as(alice).get("/api/reservations/suggest/", {"gpu_count": 2, "hours": 1}).json()
    assert parse(body["start"]) == at(2) and len(body["gpus"]) == 2
    body = api_as(alice).get("/api/reservations/suggest/", {"gpu_count": 1, "hours": 1}).json()
    assert parse(body["start"]) == at(0) and body["gpu_labels"] == ["gpu01/gpu3"]
    assert (
        api_as(alice).get("/api/reservations/suggest/", {"gpu_count": 9, "hours": 1}).status_code
        == 404
    )


def test_the_feed_action_gives_a_secret_ical_url(alice: Any, bob: Any) -> None:
    url = api_as(alice).get("/api/reservations/feed/").json()["url"]
    assert url.startswith("http://testserver/reservations/ical/") and url.endswith(".ics")
    assert api_as(bob).get("/api/reservations/feed/").json()["url"] != url


def test_the_schema_documents_the_reservation_actions(alice: Any) -> None:
    from django.test import Client

    client = Client()
    client.force_login(alice)
    schema = client.get("/api/schema/").content.decode()
    for path in (
        "/api/v1/reservations/{id}/cancel/",
        "/api/v1/reservations/{id}/extend/",
        "/api/v1/reservations/suggest/",
    ):
        assert path in schema

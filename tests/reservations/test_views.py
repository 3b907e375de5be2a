"""The pages: calendar, booking, suggestions and My reservations, for alice, bob, charlie and the admin."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import Client

from reservations.models import BookingRule, Reservation
from reservations.services import reservation_create
from tests.reservations.conftest import at
from tests.reservations.factories import running_job

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _setup(contracts: Any, clock: Any) -> None:
    pass


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def alices(alice: Any, gpus: list[Any]) -> Reservation:
    return reservation_create(
        user=alice, gpu_ids=[gpus[0].pk], start=at(1), end=at(3), note="alice's run"
    )


def test_pages_need_a_login() -> None:
    for url in (
        "/reservations/",
        "/reservations/mine/",
        "/reservations/book/",
        "/reservations/suggest/",
    ):
        response = Client().get(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_the_calendar_shows_own_and_other_bookings_and_running_jobs(
    alice: Any, bob: Any, gpus: list[Any], alices: Reservation
) -> None:
    running_job(owner=bob, gpus=[gpus[2]], time_limit_s=3600)
    page = client_for(alice).get("/reservations/", {"date": "2027-03-01"}).content.decode()
    assert "cal-bar bar-mine" in page and "alice&#x27;s run" in page
    assert "cal-bar bar-job" in page
    page_bob = client_for(bob).get("/reservations/", {"date": "2027-03-01"}).content.decode()
    assert "cal-bar bar-other" in page_bob and "cal-bar bar-mine" not in page_bob
    # Like the queue, the calendar says whose a booking is and what it is for.
    assert "alice&#x27;s run" in page_bob
    assert "booked by alice" in page_bob


def test_the_calendar_escapes_a_bookings_note_in_its_bar_and_title(
    alice: Any, bob: Any, gpus: list[Any]
) -> None:
    reservation_create(
        user=alice, gpu_ids=[gpus[1].pk], start=at(1), end=at(3), note='<b>"x"</b> & co'
    )
    for viewer in (alice, bob):
        for view in ({}, {"view": "week"}):
            page = (
                client_for(viewer)
                .get("/reservations/", {"date": "2027-03-01", **view})
                .content.decode()
            )
            assert "<b>" not in page
            assert "&lt;b&gt;&quot;x&quot;&lt;/b&gt; &amp; co" in page


def test_the_week_view_has_168_hour_columns(alice: Any, gpus: list[Any]) -> None:
    page = (
        client_for(alice)
        .get("/reservations/", {"view": "week", "date": "2027-03-03"})
        .content.decode()
    )
    assert page.count('class="cal-col') == 168
    assert "Week of" in page


def test_the_calendar_cells_link_to_a_prefilled_booking_form(alice: Any, gpus: list[Any]) -> None:
    page = client_for(alice).get("/reservations/", {"date": "2027-03-01"}).content.decode()
    assert (
        f"/reservations/book/?gpus={gpus[0].pk}&amp;start=2027-03-01T10:00&amp;end=2027-03-01T10:30"
        in page
    )
    form = client_for(alice).get(
        f"/reservations/book/?gpus={gpus[0].pk}&start=2027-03-01T10:00&end=2027-03-01T10:30"
    )
    assert 'value="2027-03-01T10:00"' in form.content.decode()


def test_booking_through_the_form_redirects_to_the_calendar(alice: Any, gpus: list[Any]) -> None:
    response = client_for(alice).post(
        "/reservations/book/",
        {"gpus": [gpus[1].pk], "start": "2027-03-01T10:00", "end": "2027-03-01T12:00", "note": "x"},
    )
    assert response.status_code == 302
    assert Reservation.objects.get(user=alice).end == at(3)


def test_booking_with_htmx_answers_with_a_redirect_header(alice: Any, gpus: list[Any]) -> None:
    response = client_for(alice).post(
        "/reservations/book/",
        {"gpus": [gpus[1].pk], "start": "2027-03-01T10:00", "end": "2027-03-01T12:00"},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 204 and response["HX-Redirect"].startswith(
        "/reservations/?date=2027-03-01"
    )


def test_a_refused_booking_says_why_and_offers_the_suggested_slot(
    bob: Any, gpus: list[Any], alices: Reservation
) -> None:
    response = client_for(bob).post(
        "/reservations/book/",
        {"gpus": [gpus[0].pk], "start": "2027-03-01T10:00", "end": "2027-03-01T11:00"},
        headers={"HX-Request": "true"},
    )
    page = response.content.decode()
    assert response.status_code == 200
    assert "already booked" in page and "Use the suggested slot" in page
    assert "start=2027-03-01T12%3A00" in page


def test_members_do_not_see_the_maintenance_box_but_admins_do(
    alice: Any, admin_user: Any, gpus: list[Any]
) -> None:
    assert 'name="maintenance"' not in client_for(alice).get("/reservations/book/").content.decode()
    assert (
        'name="maintenance"' in client_for(admin_user).get("/reservations/book/").content.decode()
    )


def test_suggest_shows_the_earliest_slot(alice: Any, gpus: list[Any]) -> None:
    page = (
        client_for(alice)
        .get("/reservations/suggest/", {"gpu_count": 4, "hours": 2}, headers={"HX-Request": "true"})
        .content.decode()
    )
    assert "Earliest free slot" in page and "gpu01/gpu0, gpu01/gpu1, gpu01/gpu2, gpu01/gpu3" in page


def test_my_reservations_lists_only_mine(
    alice: Any, bob: Any, charlie: Any, alices: Reservation
) -> None:
    assert "alice&#x27;s run" in client_for(alice).get("/reservations/mine/").content.decode()
    for other in (bob, charlie):
        assert (
            "alice&#x27;s run" not in client_for(other).get("/reservations/mine/").content.decode()
        )


@pytest.mark.parametrize("verb", ["cancel", "release", "extend"])
def test_bob_and_charlie_get_404_on_alices_actions(
    verb: str, bob: Any, charlie: Any, alices: Reservation
) -> None:
    for other in (bob, charlie):
        assert (
            client_for(other).post(f"/reservations/{alices.pk}/{verb}/", {"hours": 1}).status_code
            == 404
        )
    alices.refresh_from_db()
    assert alices.state == Reservation.State.BOOKED and alices.end == at(3)


def test_alice_extends_and_cancels_from_my_reservations(alice: Any, alices: Reservation) -> None:
    client = client_for(alice)
    assert client.post(f"/reservations/{alices.pk}/extend/", {"hours": "1.5"}).status_code == 302
    alices.refresh_from_db()
    assert alices.end == at(4.5)
    response = client.post(f"/reservations/{alices.pk}/cancel/", follow=True)
    assert "cancelled and refunded" in response.content.decode()
    alices.refresh_from_db()
    assert alices.state == Reservation.State.CANCELLED


def test_a_refused_action_shows_the_reason(alice: Any, alices: Reservation, clock: Any) -> None:
    clock.move_to(at(2))
    response = client_for(alice).post(f"/reservations/{alices.pk}/cancel/", follow=True)
    assert "release it early" in response.content.decode()


def test_the_admin_may_cancel_alices_booking_from_the_page(
    admin_user: Any, alices: Reservation
) -> None:
    assert client_for(admin_user).post(f"/reservations/{alices.pk}/cancel/").status_code == 302
    alices.refresh_from_db()
    assert alices.state == Reservation.State.CANCELLED


def test_the_pages_render_in_chinese(alice: Any, gpus: list[Any], alices: Reservation) -> None:
    client = client_for(alice)
    client.cookies["django_language"] = "zh-hans"
    assert client.get("/reservations/").status_code == 200
    assert client.get("/reservations/mine/").status_code == 200


def test_each_week_cell_is_a_labelled_booking_link_for_a_future_day(
    alice: Any, gpus: list[Any]
) -> None:
    page = (
        client_for(alice)
        .get("/reservations/", {"view": "week", "date": "2027-03-10"})
        .content.decode()
    )
    label = gpus[0].label
    # One link per GPU and day (a week of hours was 11,000 links on a big lab's 64 GPUs),
    # offering the day from midnight for at most the longest booking the rules allow.
    longest = BookingRule.for_user(alice).max_length
    end = (datetime(2027, 3, 8) + min(longest, timedelta(days=1))).strftime("%Y-%m-%dT%H:%M")
    cell = (
        f'<a class="cal-cell busy-0 day-start" href="/reservations/book/?gpus={gpus[0].pk}'
        f'&amp;start=2027-03-08T00:00&amp;end={end}" data-col="0"'
        f' style="grid-column:span 24" aria-label="Book {label} at '
    )
    assert cell in page
    assert page.count('<a class="cal-cell') == 7 * len(gpus)


def test_extending_past_what_the_form_takes_says_the_maximum(
    alice: Any, alices: Reservation
) -> None:
    response = client_for(alice).post(
        f"/reservations/{alices.pk}/extend/", {"hours": "500"}, follow=True
    )
    page = response.content.decode()
    max_hours = BookingRule.for_user(alice).max_length.total_seconds() / 3600
    assert f"at most {max_hours:g} hours in all" in page
    assert "this one already lasts 2 h" in page


@pytest.mark.parametrize("count", ["99", "5"])
def test_a_number_of_gpus_the_node_lacks_says_how_many_it_has(
    alice: Any, gpus: list[Any], count: str
) -> None:
    node = gpus[0].node
    whole = node.gpus.count()
    response = client_for(alice).post(
        "/reservations/book/",
        {
            "node": node.pk,
            "gpu_count": count,
            "start": "2027-03-01T10:00",
            "end": "2027-03-01T12:00",
        },
    )
    page = response.content.decode()
    assert response.status_code == 400  # the form again, with the reason by the field
    assert "Choose the GPUs, or a node and a number" not in page
    if int(count) > 64:
        assert "less than or equal to 64" in page
    else:
        assert f"{node.name} has {whole} GPUs: book at most that many" in page
    assert not Reservation.objects.filter(user=alice).exists()


def test_the_count_refusal_reads_in_chinese(alice: Any, gpus: list[Any]) -> None:
    client = client_for(alice)
    response = client.post(
        "/reservations/book/",
        {
            "node": gpus[0].node.pk,
            "gpu_count": "5",
            "start": "2027-03-01T10:00",
            "end": "2027-03-01T12:00",
        },
        HTTP_ACCEPT_LANGUAGE="zh-hans",
    )
    assert "gpu01 只有 4 块 GPU：最多预约这么多" in response.content.decode()


@pytest.mark.parametrize(
    ("language", "heading", "book"),
    [
        (
            "en",
            "Monday, 1 Mar 2027",
            'or <a href="/reservations/book/">open the booking form</a>.',
        ),
        ("zh-hans", "2027年3月1日 星期一", '或<a href="/reservations/book/">打开预约表单</a>。'),
    ],
)
def test_the_day_heading_and_the_booking_hint_read_natively(
    alice: Any, gpus: list[Any], language: str, heading: str, book: str
) -> None:
    client = client_for(alice)
    client.cookies["django_language"] = language
    page = client.get("/reservations/", {"date": "2027-03-01"}).content.decode()
    assert f"<h2>{heading}</h2>" in page
    assert book in page


def test_the_calendar_rows_name_each_node_and_gpu_and_escape_what_agents_report(
    alice: Any, gpus: list[Any]
) -> None:
    from cluster.models import Gpu

    gpus[1].model = 'A100 <b>"80GB"</b>'
    gpus[1].save(update_fields=["model"])
    Gpu.objects.filter(pk=gpus[2].pk).update(state=Gpu.State.DISABLED)
    page = client_for(alice).get("/reservations/", {"date": "2027-03-01"}).content.decode()
    assert page.count('<div class="cal-node">') == 2
    assert '<div class="cal-node">gpu01 <span class="state state-up">' in page
    for gpu in gpus:
        assert f'data-gpu="{gpu.pk}" data-node="{gpu.node_id}"' in page
    assert 'title="A100 &lt;b&gt;&quot;80GB&quot;&lt;/b&gt;"' in page and "<b>" not in page
    # A GPU that cannot be booked says so and offers no link; the others offer one per cell.
    drained = page.split(f'data-gpu="{gpus[2].pk}"')[1].split('<div class="cal-row"')[0]
    assert "not bookable" in drained and "<a " not in drained
    bookable = page.split(f'data-gpu="{gpus[3].pk}"')[1].split('<div class="cal-row"')[0]
    assert f"?gpus={gpus[3].pk}&amp;start=2027-03-01T" in bookable
    assert 'aria-label="Book gpu01/gpu3 at' in bookable


def test_the_calendars_suggest_form_offers_the_nodes_up_now_in_the_members_language(
    alice: Any, gpus: list[Any]
) -> None:
    from cluster.models import Node

    client = client_for(alice)
    page = client.get("/reservations/").content.decode()
    assert ">gpu02</option>" in page
    Node.objects.filter(name="gpu02").update(state=Node.State.DRAINING)
    page = client.get("/reservations/").content.decode()
    assert ">gpu02</option>" not in page and ">gpu01</option>" in page
    page = client.get("/reservations/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "任意节点" in page and ">gpu01</option>" in page

"""A member books a slot on the calendar by dragging, and sees it in My reservations."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from reservations.models import Reservation
from tests.browser.conftest import log_in
from tests.conftest import PASSWORD
from tests.factories import GpuFactory, NodeFactory
from tests.reservations.conftest import Contracts, contracts  # noqa: F401  (fixture)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_member_drags_on_the_calendar_books_and_sees_it_in_my_reservations(
    page: Any,
    live_server: Any,
    alice: Any,
    contracts: Contracts,  # noqa: F811
) -> None:
    node = NodeFactory(name="gpu01")
    for index in range(2):
        GpuFactory(node=node, index=index, model="NVIDIA H200")
    day = (timezone.localdate() + timedelta(days=1)).isoformat()

    log_in(page, live_server, "alice", PASSWORD)
    page.wait_for_selector("[data-testid=username]")
    page.goto(f"{live_server.url}/reservations/?date={day}")
    row = page.locator('[data-testid="gpu-row-gpu01/gpu1"]')
    first = row.locator(f'a.cal-cell[href*="start={day}T10:00&"]')
    last = row.locator(f'a.cal-cell[href*="start={day}T11:30&"]')
    first.hover()
    page.mouse.down()
    last.hover()
    page.mouse.up()

    form = page.locator("#booking-panel [data-testid=booking-form]")
    form.wait_for()
    assert form.locator("input[name=start]").input_value() == f"{day}T10:00"
    assert form.locator("input[name=end]").input_value() == f"{day}T12:00"
    form.locator("input[name=note]").fill("ablation study")
    form.locator("[data-testid=book-submit]").click()

    page.wait_for_selector("text=Booked gpu01/gpu1")
    assert page.locator(".cal-bar.bar-mine").count() == 1
    page.click("[data-testid=my-reservations]")
    page.wait_for_selector("h1:has-text('My reservations')")
    table = page.inner_text("[data-testid=live-reservations]")
    assert "gpu01/gpu1" in table and "ablation study" in table
    reservation = Reservation.objects.get(user=alice)
    assert timezone.localtime(reservation.start).strftime("%Y-%m-%dT%H:%M") == f"{day}T10:00"
    assert reservation.end - reservation.start == timedelta(hours=2)

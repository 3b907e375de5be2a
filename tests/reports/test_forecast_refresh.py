"""The demand forecast is fitted by the control worker, never in a page request: the page
shows the last fit with its date, or says one is being computed, and queues one fit per
data version however many pages ask."""

from __future__ import annotations

import datetime as dt
from typing import Any
from unittest import mock

import pytest
import time_machine
from django.test import Client

from reports import services
from reports.models import DemandForecast
from tests.conftest import PASSWORD
from tests.factories import GpuFactory
from tests.reports.conftest import make_job

pytestmark = pytest.mark.django_db
FIRST = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)
NOW = FIRST + dt.timedelta(days=7 * 16, hours=9)  # Tuesday of week 17: 16 weeks of history
PATTERN = [160.0, 120.0, 80.0, 40.0]


@pytest.fixture
def history(queues: Any, alice: Any) -> Any:
    """16 weeks of one 1-GPU job each Monday whose length repeats 160, 120, 80, 40 hours."""
    gpu = GpuFactory.create(model="A100")
    for i in range(16):
        monday = FIRST + dt.timedelta(days=7 * i)
        hours = PATTERN[i % 4]
        make_job(
            alice, "normal", [gpu], monday, monday, monday + dt.timedelta(hours=hours), "completed"
        )
    return gpu


def page(client: Client, capture: Any) -> str:
    with capture(execute=True):
        response = client.get("/reports/?period=year&at=2026-04-01")
    assert response.status_code == 200
    return response.content.decode()


def no_fit(*_args: Any, **_kwargs: Any) -> Any:
    raise AssertionError("the forecast was fitted inside a web request")


@pytest.fixture
def client(alice: Any) -> Client:
    client = Client()
    assert client.login(username=alice.username, password=PASSWORD)
    return client


@time_machine.travel(NOW, tick=False)
def test_a_page_never_fits_it_queues_one_fit_and_shows_it_once_the_worker_has(
    history: Any, client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    with (
        mock.patch("reports.forecast._fit", no_fit),
        mock.patch("reports.tasks.forecast_refresh.delay") as delay,
    ):
        first = page(client, django_capture_on_commit_callbacks)
        second = page(client, django_capture_on_commit_callbacks)
        assert client.get("/reports/charts/forecast.png").status_code == 404
    for html in (first, second):
        assert "The demand forecast is being computed" in html
        assert 'hx-get="/reports/forecast/"' in html  # the section polls until it is there
    delay.assert_called_once_with()  # two views, one fit queued
    assert not DemandForecast.objects.exists()

    services.forecast_refresh()  # what the control worker does with the message
    row = DemandForecast.objects.get()
    assert row.forecast is not None and len(row.forecast["mean"]) == 8
    with mock.patch("reports.forecast._fit", no_fit):
        section = client.get("/reports/forecast/").content.decode()
        html = page(client, django_capture_on_commit_callbacks)
        chart = client.get("/reports/charts/forecast.png")
    assert chart.status_code == 200 and chart["Content-Type"] == "image/png"
    for text in (section, html):
        assert "being computed" not in text and "hx-get" not in text.split('id="forecast"')[1][:200]
        assert f"Forecast as of {NOW:%Y-%m-%d %H:%M}." in text
        assert "Back-test: forecasting the last 4 weeks" in text
        assert "updating" not in text and "updated forecast" not in text
    mape = row.forecast["backtest_mape_pct"]
    assert f"missed by {mape:.1f}% on average" in html  # the same fit as the stored one


@time_machine.travel(NOW, tick=False)
def test_a_stale_forecast_is_shown_with_its_date_while_a_new_one_is_fitted(
    history: Any, alice: Any, client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    old = services.forecast_refresh()
    assert services.forecast_refresh().pk == old.pk  # same data: the task does nothing
    # A job of the history ends: a new data version.
    make_job(alice, "normal", [history], FIRST, FIRST, NOW - dt.timedelta(hours=1), "completed")
    with (
        mock.patch("reports.forecast._fit", no_fit),
        mock.patch("reports.tasks.forecast_refresh.delay") as delay,
    ):
        html = page(client, django_capture_on_commit_callbacks)
        page(client, django_capture_on_commit_callbacks)
    delay.assert_called_once_with()
    assert f"Forecast as of {NOW:%Y-%m-%d %H:%M}." in html
    assert "an updated forecast is being computed" in html
    assert "Week of" in html  # the old forecast's table is still there

    new = services.forecast_refresh()
    assert new.pk != old.pk and list(DemandForecast.objects.all()) == [new]
    assert new.forecast != old.forecast  # the extra 10 days of the first week count
    with mock.patch("reports.tasks.forecast_refresh.delay") as delay:
        html = page(client, django_capture_on_commit_callbacks)
    delay.assert_not_called()
    assert "updated forecast is being computed" not in html


@time_machine.travel(NOW, tick=False)
def test_a_broker_that_cannot_be_reached_does_not_fail_the_page(
    history: Any, client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    with mock.patch("reports.tasks.forecast_refresh.delay", side_effect=OSError("no broker")):
        assert "being computed" in page(client, django_capture_on_commit_callbacks)
    with mock.patch("reports.tasks.forecast_refresh.delay") as delay:
        page(client, django_capture_on_commit_callbacks)
    delay.assert_called_once_with()  # the lock was given back, so the next view asks again


def test_too_little_history_is_said_once_fitted(
    client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    services.forecast_refresh()
    assert DemandForecast.objects.get().forecast is None
    html = page(client, django_capture_on_commit_callbacks)
    assert "Not enough history for a forecast yet" in html and "being computed" not in html


@time_machine.travel(NOW, tick=False)
def test_the_chinese_page_says_the_forecast_is_being_computed(
    history: Any, client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    with (
        mock.patch("reports.tasks.forecast_refresh.delay"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        html = client.get("/reports/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "正在计算需求预测" in html


def test_the_fit_is_on_the_hourly_beat() -> None:
    from django.conf import settings

    entry = settings.CELERY_BEAT_SCHEDULE["reports-forecast-refresh"]
    assert entry["task"] == "control.reports_forecast_refresh"


def test_staff_see_when_the_forecast_was_fitted_in_the_admin_and_cannot_edit_it(
    history: Any, admin_user: Any
) -> None:
    services.forecast_refresh()
    row = DemandForecast.objects.get()
    client = Client()
    client.force_login(admin_user)
    listing = client.get("/admin/reports/demandforecast/")
    assert listing.status_code == 200
    assert row.version in listing.content.decode()
    assert client.get("/admin/reports/demandforecast/add/").status_code == 403
    client.post(f"/admin/reports/demandforecast/{row.pk}/change/", {"version": "forged"})
    row.refresh_from_db()
    assert row.version != "forged"

"""My credits page and the credits API: balance, filters, burn rate, and who may see what."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
import time_machine

from accounts.services import ledger_post
from tests.conftest import PASSWORD, api_as

pytestmark = pytest.mark.django_db


def seed(user: Any) -> None:
    with time_machine.travel(datetime(2025, 2, 3, tzinfo=UTC)):
        ledger_post(user=user, amount=Decimal("1000"), kind="grant", idempotency_key=f"g-{user.pk}")
    with time_machine.travel(datetime(2025, 3, 3, tzinfo=UTC)):
        ledger_post(user=user, amount=Decimal("-40"), kind="charge", idempotency_key=f"c-{user.pk}")


def test_my_credits_shows_the_balance_burn_rate_and_ledger(client: Any, alice: Any) -> None:
    seed(alice)
    client.login(username="alice", password=PASSWORD)
    with time_machine.travel(datetime(2025, 3, 5, tzinfo=UTC)):
        page = client.get("/account/credits/").content.decode()
    assert "960.0" in page
    assert "5.7 credits per day" in page
    assert 'hx-get="/account/credits/summary/"' in page
    assert page.count('class="kind-') == 2


def test_the_ledger_filters_by_kind_and_month(client: Any, alice: Any) -> None:
    seed(alice)
    client.login(username="alice", password=PASSWORD)
    assert client.get("/account/credits/?kind=charge").content.decode().count('class="kind-') == 1
    assert (
        client.get("/account/credits/?month=2025-02").content.decode().count('class="kind-grant"')
        == 1
    )
    bad = client.get("/account/credits/?month=March")
    assert bad.status_code == 200 and "Give the month as YYYY-MM" in bad.content.decode()
    year_zero = client.get("/account/credits/?month=0000-01")
    assert year_zero.status_code == 200
    assert "Give the month as YYYY-MM" in year_zero.content.decode()


def test_the_layout_shows_the_balance_in_the_header(client: Any, alice: Any) -> None:
    seed(alice)
    client.login(username="alice", password=PASSWORD)
    page = client.get("/account/notifications/").content.decode()
    # Whole credits from 100 up: the header stays one row with a four-digit balance.
    assert re.search(r'data-testid="nav-credits">[^<]*\b960<', page), page[:3000]


def test_the_api_gives_your_balance_and_ledger_and_staff_may_look_at_anyone(
    alice: Any, charlie: Any, admin_user: Any
) -> None:
    seed(alice)
    assert api_as(alice).get("/api/credits/").json()["balance"] == "960.000"
    assert api_as(charlie).get("/api/credits/").json()["balance"] == "0.000"
    assert api_as(charlie).get("/api/credits/?user=alice").status_code == 400
    assert api_as(charlie).get("/api/ledger/").json()["results"] == []
    assert api_as(charlie).get("/api/ledger/?user=alice").status_code == 400
    assert api_as(admin_user).get("/api/credits/?user=alice").json()["balance"] == "960.000"
    entries = api_as(alice).get("/api/ledger/?kind=charge&month=2025-03").json()["results"]
    assert [(e["kind"], e["amount"]) for e in entries] == [("charge", "-40.000")]


def test_bad_ledger_filters_get_a_clear_400(alice: Any) -> None:
    client = api_as(alice)
    assert "use one of" in client.get("/api/ledger/?kind=bonus").json()["kind"][0]
    assert "YYYY-MM" in client.get("/api/ledger/?month=2025-13").json()["month"][0]
    year_zero = client.get("/api/ledger/?month=0000-01")
    assert year_zero.status_code == 400 and "YYYY-MM" in year_zero.json()["month"][0]


@pytest.mark.parametrize(
    ("language", "reward", "runs_out"),
    [
        ("en", "earn back 10% of their charge", "(in 168 days at this rate)"),
        ("zh-hans", "可返还其费用的 10%。", "（按此速度 168 天后）"),
    ],
)
def test_my_credits_gives_the_reward_as_a_percentage_and_the_run_out_in_days(
    client: Any, alice: Any, language: str, reward: str, runs_out: str
) -> None:
    seed(alice)  # 960 credits left, 40 spent in the last week: 168 days at 5.7 a day
    client.login(username="alice", password=PASSWORD)
    with time_machine.travel(datetime(2025, 3, 5, tzinfo=UTC)):
        page = client.get("/account/credits/", HTTP_ACCEPT_LANGUAGE=language).content.decode()
    assert reward in page
    assert runs_out in page
    assert "0.100" not in page and "weeks" not in page and "周" not in page


def test_a_balance_that_runs_out_within_a_day_says_so(client: Any, alice: Any) -> None:
    with time_machine.travel(datetime(2025, 3, 1, tzinfo=UTC)):
        ledger_post(user=alice, amount=Decimal("10"), kind="grant", idempotency_key="g")
        ledger_post(user=alice, amount=Decimal("-7"), kind="charge", idempotency_key="c1")
        ledger_post(user=alice, amount=Decimal("-1"), kind="charge", idempotency_key="c2")
    client.login(username="alice", password=PASSWORD)
    with time_machine.travel(datetime(2025, 3, 2, tzinfo=UTC)):
        page = client.get("/account/credits/summary/", HTTP_ACCEPT_LANGUAGE="zh-hans")
    # 2 credits left at 8/7 a day: under two days, so "1 天"; one credit less would be a day.
    assert "（按此速度 1 天后）" in page.content.decode()

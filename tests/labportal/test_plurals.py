"""Counts read as English does ("at most 1 GPU", "for 2 minutes"), and Chinese, which has one
plural form, gets its one translation for every count."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from django.template.loader import render_to_string
from django.utils import translation

from alerts.texts import alert_advice, alert_message
from reservations.models import BookingRules
from reservations.services import _check_rules

NOW = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)


def rules(**overrides: Any) -> BookingRules:
    values: dict[str, Any] = {
        "max_gpus_per_booking": 4,
        "min_length": timedelta(minutes=30),
        "max_length": timedelta(hours=24),
        "granularity": timedelta(minutes=30),
        "end_policy": "warn",
        "warn_before_end": timedelta(minutes=10),
        "max_gpu_hours_per_week": Decimal("100"),
        "max_days_ahead": 14,
    }
    return BookingRules(**{**values, **overrides})


def refusal(language: str, booking_rules: BookingRules, gpus: int, hours: int) -> str:
    start = NOW + timedelta(hours=1)
    with translation.override(language), pytest.raises(Exception) as refused:
        _check_rules(
            user=None,
            rules=booking_rules,
            gpu_count=gpus,
            start=start,
            end=start + timedelta(hours=hours),
            now=NOW,
        )
    return str(refused.value)


@pytest.mark.parametrize(
    ("count", "english"),
    [
        (1, "at most 1 GPU at once; you asked for 3."),
        (2, "at most 2 GPUs at once; you asked for 3."),
    ],
)
def test_a_booking_refusal_counts_its_gpus(count: int, english: str) -> None:
    assert english in refusal("en", rules(max_gpus_per_booking=count), gpus=3, hours=1)
    chinese = refusal("zh-hans", rules(max_gpus_per_booking=count), gpus=3, hours=1)
    assert chinese == f"你的用户类别每次最多可预约 {count} 块 GPU；你申请了 3 块。"


@pytest.mark.parametrize(("count", "english"), [(1, "at most 1 hour;"), (2, "at most 2 hours;")])
def test_a_booking_refusal_counts_its_hours(count: int, english: str) -> None:
    long_booking = rules(max_length=timedelta(hours=count))
    assert english in refusal("en", long_booking, gpus=1, hours=3)
    assert f"{count} 小时" in refusal("zh-hans", long_booking, gpus=1, hours=3)


@pytest.mark.parametrize(
    ("minutes", "english", "chinese"),
    [
        (1, "utilisation for 1 minute.", "1 分钟"),
        (2, "utilisation for 2 minutes.", "2 分钟"),
    ],
)
def test_an_idle_alert_counts_its_minutes_in_the_message_and_the_advice(
    minutes: int, english: str, chinese: str
) -> None:
    params = {"job_id": 7, "threshold": 10, "minutes": minutes, "action": "stop"}
    params["grace_min"] = minutes
    with translation.override("en"):
        assert str(alert_message("idle_job", params)).endswith(english)
        advice = str(alert_advice("idle_job", params))
        assert advice.endswith(f"the job is stopped in {minutes} minute{'s' * (minutes > 1)}.")
    with translation.override("zh-hans"):
        assert chinese in str(alert_message("idle_job", params))
        assert chinese in str(alert_advice("idle_job", params))


def test_an_old_alert_without_its_count_still_reads() -> None:
    with translation.override("en"):
        assert "has been idle for" in str(alert_message("idle_session", {"job_id": 7}))


@pytest.mark.parametrize(
    ("burn", "english", "chinese"),
    [
        (Decimal("1"), "1.0 credit per day", "每天 1.0 积分"),
        (Decimal("2"), "2.0 credits per day", "每天 2.0 积分"),
        (Decimal("1.5"), "1.5 credits per day", "每天 1.5 积分"),
    ],
)
def test_the_burn_rate_counts_its_credits(burn: Decimal, english: str, chinese: str) -> None:
    summary = SimpleNamespace(
        balance=Decimal("10"), burn_per_day=burn, runs_out_at=None, next_grant_on=NOW.date()
    )
    with translation.override("en"):
        assert english in render_to_string("accounts/_credit_summary.html", {"summary": summary})
    with translation.override("zh-hans"):
        assert chinese in render_to_string("accounts/_credit_summary.html", {"summary": summary})

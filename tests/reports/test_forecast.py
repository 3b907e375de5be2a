"""The demand forecast and its back-test, on series with a known weekly pattern."""

from __future__ import annotations

import datetime as dt
import io
import math
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from reports.forecast import HORIZON_WEEKS, demand_forecast, mape_pct, weekly_demand
from tests.factories import GpuFactory
from tests.reports.conftest import make_job

START = dt.date(2026, 1, 5)


def weeks(n: int) -> list[dt.date]:
    return [START + dt.timedelta(days=7 * i) for i in range(n)]


def test_a_steady_four_week_cycle_is_forecast_closely() -> None:
    # 200 GPU-h a week plus a month-end peak: +60, +20, -20, -60 repeating, for 24 weeks.
    pattern = [60.0, 20.0, -20.0, -60.0]
    history = [200.0 + pattern[i % 4] for i in range(24)]
    forecast = demand_forecast(weeks=weeks(24), history=history)
    assert forecast is not None
    assert len(forecast.mean) == HORIZON_WEEKS
    assert forecast.weeks[0] == START + dt.timedelta(days=7 * 24)
    expected = [200.0 + pattern[(24 + i) % 4] for i in range(HORIZON_WEEKS)]
    assert forecast.mean == pytest.approx(expected, abs=5)
    assert forecast.backtest_mape_pct is not None and forecast.backtest_mape_pct < 3
    assert all(
        lo <= m <= hi
        for lo, m, hi in zip(forecast.lower, forecast.mean, forecast.upper, strict=True)
    )


def test_a_noisy_series_gets_a_wider_band_and_a_larger_backtest_error() -> None:
    steady = [100.0] * 20
    noisy = [100.0 + 40 * math.sin(i * 2.3) for i in range(20)]
    a = demand_forecast(weeks=weeks(20), history=steady)
    b = demand_forecast(weeks=weeks(20), history=noisy)
    assert a is not None and b is not None
    assert (b.upper[0] - b.lower[0]) > (a.upper[0] - a.lower[0])
    assert b.backtest_mape_pct is not None and a.backtest_mape_pct is not None
    assert b.backtest_mape_pct > a.backtest_mape_pct


def test_demand_is_never_forecast_below_zero() -> None:
    falling = [float(max(0, 160 - 20 * i)) for i in range(10)]
    forecast = demand_forecast(weeks=weeks(10), history=falling)
    assert forecast is not None
    assert min(forecast.lower) >= 0 and min(forecast.mean) >= 0


def test_too_little_history_gives_no_forecast() -> None:
    assert demand_forecast(weeks=weeks(7), history=[10.0] * 7) is None


def test_mape_ignores_weeks_without_demand() -> None:
    assert mape_pct([100, 0, 50], [110, 5, 40]) == pytest.approx((10 + 20) / 2)
    assert mape_pct([0, 0], [1, 2]) is None


@pytest.mark.django_db
def test_the_backtest_command_prints_the_error_of_the_lab_s_own_weekly_demand(
    alice: Any,
    queues: Any,  # not only the data migration's: a transactional test may have flushed them
) -> None:
    # 16 weeks of one 1-GPU job each Monday whose length repeats 160, 120, 80, 40 hours.
    gpu = GpuFactory.create(model="A100")
    pattern = [160.0, 120.0, 80.0, 40.0]
    first = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)
    for i in range(16):
        monday = first + dt.timedelta(days=7 * i)
        make_job(
            alice,
            "normal",
            [gpu],
            monday,
            monday,
            monday + dt.timedelta(hours=pattern[i % 4]),
            "completed",
        )
    weeks_seen, demand = weekly_demand(now=first + dt.timedelta(days=7 * 16))
    assert demand == pytest.approx([pattern[i % 4] for i in range(16)])
    out = io.StringIO()
    call_command("reports_forecast_backtest", "--until", "2026-04-27", "--weeks", "4", stdout=out)
    text = out.getvalue()
    assert "history: 16 weeks (2026-01-05 to 2026-04-20)" in text
    assert "2026-04-20          40.0" in text  # the last hidden week, as it was
    mape = float(text.rsplit(": ", 1)[1].rstrip("%\n"))
    assert mape < 5  # a clean 4-week cycle is forecast closely


@pytest.mark.django_db
def test_the_backtest_command_says_when_history_is_too_short() -> None:
    with pytest.raises(CommandError, match="Not enough history"):
        call_command("reports_forecast_backtest", stdout=io.StringIO())

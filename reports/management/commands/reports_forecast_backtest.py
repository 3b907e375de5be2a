"""Print the demand forecast's back-test: hide the last weeks of the lab's history, forecast
them from the weeks before, and compare (MAPE, and each hidden week).

    python manage.py reports_forecast_backtest [--until 2026-01-01] [--weeks 4]
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from reports.forecast import BACKTEST_WEEKS, MIN_HISTORY_WEEKS, demand_forecast, weekly_demand


class Command(BaseCommand):
    help = "Back-test the weekly demand forecast on the lab's own history and print its error."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--until",
            type=dt.date.fromisoformat,
            help="use the history of the weeks before this day (default: today)",
        )
        parser.add_argument(
            "--weeks", type=int, default=BACKTEST_WEEKS, help="weeks to hide and forecast"
        )

    def handle(self, *args: Any, until: dt.date | None, weeks: int, **options: Any) -> None:
        now = (
            timezone.make_aware(dt.datetime.combine(until, dt.time.min))
            if until is not None
            else timezone.now()
        )
        if weeks < 1:
            raise CommandError("--weeks must be at least 1.")
        history_weeks, history = weekly_demand(now=now)
        forecast = demand_forecast(weeks=history_weeks, history=history, backtest_weeks=weeks)
        if forecast is None or forecast.backtest_mape_pct is None:
            raise CommandError(
                f"Not enough history to back-test: {len(history)} complete weeks, "
                f"{MIN_HISTORY_WEEKS - 1 + weeks} needed."
            )
        hidden = history_weeks[-forecast.backtest_weeks :]
        self.stdout.write(
            f"history: {len(history)} weeks ({history_weeks[0]} to {history_weeks[-1]}), "
            f"model {forecast.model}"
        )
        self.stdout.write("week        actual GPU-h  forecast GPU-h  error %")
        for week, actual, predicted in zip(
            hidden, forecast.backtest_actual, forecast.backtest_predicted, strict=True
        ):
            error = f"{100 * abs(predicted - actual) / actual:7.1f}" if actual > 0 else "      —"
            self.stdout.write(f"{week}  {actual:12.1f}  {predicted:14.1f}  {error}")
        self.stdout.write(
            f"back-test MAPE over the last {forecast.backtest_weeks} weeks: "
            f"{forecast.backtest_mape_pct:.1f}%"
        )

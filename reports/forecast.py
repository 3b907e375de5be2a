"""Demand forecast: weekly GPU-hours of demand for the next weeks, with an uncertainty band.

The model is statsmodels' exponential smoothing state-space model (ETS): additive
errors, an optional damped trend and an optional 4-week season, chosen by AIC. It is
back-tested by hiding the last weeks of history and forecasting them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from django.db.models import Case, Count, FloatField, Sum, Value, When
from django.db.models.functions import Cast, Coalesce, Greatest, TruncWeek
from django.utils import timezone

from jobqueue.models import Job
from reports.optional import require
from reports.sql import EpochSeconds
from reports.weeks import week_start

HORIZON_WEEKS = 8
BACKTEST_WEEKS = 4
MIN_HISTORY_WEEKS = 8
SEASON_WEEKS = 4
BAND = 0.80
# A shared slot is a quarter of a GPU (the default of 4 slots per GPU).
SHARED_SLOT_UNITS = 0.25


@dataclass
class Forecast:
    history_weeks: list[dt.date]
    history: list[float]
    weeks: list[dt.date]
    mean: list[float]
    lower: list[float]
    upper: list[float]
    model: str
    backtest_mape_pct: float | None
    backtest_weeks: int
    # The hidden weeks' demand and what the model fitted on the weeks before forecast.
    backtest_actual: list[float] = field(default_factory=list)
    backtest_predicted: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Every field, for storing (dates as ISO strings); `from_json` reads it back."""
        data = dataclasses.asdict(self)
        for name in ("history_weeks", "weeks"):
            data[name] = [w.isoformat() for w in data[name]]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Forecast:
        dates = {
            name: [dt.date.fromisoformat(w) for w in data[name]]
            for name in ("history_weeks", "weeks")
        }
        return cls(**{**data, **dates})

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "band": BAND,
            "backtest_weeks": self.backtest_weeks,
            "backtest_mape_pct": None
            if self.backtest_mape_pct is None
            else round(self.backtest_mape_pct, 1),
            "history": [
                {"week": w.isoformat(), "gpu_hours": round(v, 2)}
                for w, v in zip(self.history_weeks, self.history, strict=True)
            ],
            "forecast": [
                {
                    "week": w.isoformat(),
                    "gpu_hours": round(m, 2),
                    "lower": round(lo, 2),
                    "upper": round(hi, 2),
                }
                for w, m, lo, hi in zip(self.weeks, self.mean, self.lower, self.upper, strict=True)
            ],
        }


def weekly_demand(*, now: dt.datetime | None = None) -> tuple[list[dt.date], list[float]]:
    """GPU-hours asked for per week of submission, for every complete week of history
    (summed by the database per week of submission)."""
    now = now or timezone.now()
    this_week = week_start(timezone.localtime(now).date())
    this_monday = timezone.make_aware(dt.datetime.combine(this_week, dt.time.min))
    units = Case(
        When(shared_slot=True, then=Value(SHARED_SLOT_UNITS)),
        default=Cast("gpus", FloatField()),
        output_field=FloatField(),
    )
    ran_s = Greatest(
        Value(0.0),
        Coalesce(EpochSeconds("ended_at"), Value(now.timestamp())) - EpochSeconds("started_at"),
    )
    rows = (
        Job.objects.filter(started_at__isnull=False, submitted_at__lt=this_monday)
        .order_by()
        .annotate(week=TruncWeek("submitted_at"))
        .values("week")
        .annotate(gpu_s=Sum(units * ran_s))
    )
    totals: dict[dt.date, float] = defaultdict(float)
    for row in rows:
        week = row["week"]
        day = timezone.localtime(week).date() if isinstance(week, dt.datetime) else week
        totals[day] += (row["gpu_s"] or 0.0) / 3600
    if not totals:
        return [], []
    weeks = []
    week = min(totals)
    while week < this_week:
        weeks.append(week)
        week += dt.timedelta(days=7)
    return weeks, [totals.get(w, 0.0) for w in weeks]


def _fit(history: Any) -> tuple[Any, str]:
    """The ETS model with the lowest AIC among the candidates that suit this much history."""
    ETSModel = require("statsmodels.tsa.exponential_smoothing.ets", "The demand forecast").ETSModel

    candidates: list[tuple[str, dict[str, Any]]] = [("ETS(A,N,N)", {})]
    if len(history) >= 6:
        candidates.append(("ETS(A,Ad,N)", {"trend": "add", "damped_trend": True}))
    if len(history) >= 3 * SEASON_WEEKS:
        candidates.append(("ETS(A,N,A)", {"seasonal": "add", "seasonal_periods": SEASON_WEEKS}))
        candidates.append(
            (
                "ETS(A,Ad,A)",
                {
                    "trend": "add",
                    "damped_trend": True,
                    "seasonal": "add",
                    "seasonal_periods": SEASON_WEEKS,
                },
            )
        )
    best: tuple[float, Any, str] | None = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter on short series
        for name, options in candidates:
            fit = ETSModel(history, error="add", **options).fit(disp=False)
            if best is None or fit.aic < best[0]:
                best = (fit.aic, fit, name)
    assert best is not None
    return best[1], best[2]


def _predict(history: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    pd = require("pandas", "The demand forecast")
    fit, name = _fit(pd.Series(history))
    frame = fit.get_prediction(start=len(history), end=len(history) + steps - 1).summary_frame(
        alpha=1 - BAND
    )
    clip = np.clip  # demand is never negative
    return (
        clip(frame["mean"].to_numpy(), 0, None),
        clip(frame["pi_lower"].to_numpy(), 0, None),
        clip(frame["pi_upper"].to_numpy(), 0, None),
        name,
    )


def mape_pct(actual: list[float], predicted: list[float]) -> float | None:
    """Mean absolute percentage error over the weeks with demand."""
    pairs = [(a, p) for a, p in zip(actual, predicted, strict=True) if a > 0]
    if not pairs:
        return None
    return 100 * sum(abs(a - p) / a for a, p in pairs) / len(pairs)


def forecast_version(*, now: dt.datetime | None = None) -> str:
    """The version of the data a forecast is fitted on: this week, and how many jobs of the
    history (submitted before this Monday) have started and ended. Jobs submitted this week
    are not in the history: their starts do not call for a refit."""
    this_week = week_start(timezone.localtime(now or timezone.now()).date())
    this_monday = timezone.make_aware(dt.datetime.combine(this_week, dt.time.min))
    counts = Job.objects.filter(submitted_at__lt=this_monday, started_at__isnull=False).aggregate(
        started=Count("id"), ended=Count("ended_at")
    )
    return f"{this_week}:{counts['started']}:{counts['ended']}"


@dataclass(frozen=True)
class ForecastState:
    """What the page shows: the last fitted forecast (None: too little history, or never
    fitted), when it was fitted, and whether it was fitted on the current data version."""

    forecast: Forecast | None
    fitted_at: dt.datetime | None  # None: no forecast was ever fitted
    version: str  # the current data version
    current: bool

    @property
    def computing(self) -> bool:
        return self.fitted_at is None


def latest_forecast() -> ForecastState:
    """The newest stored forecast and whether it is up to date; never fits (the control
    worker does, see reports.services.forecast_refresh)."""
    from reports.models import DemandForecast

    version = forecast_version()
    row = DemandForecast.objects.order_by("-id").first()
    if row is None:
        return ForecastState(forecast=None, fitted_at=None, version=version, current=False)
    return ForecastState(
        forecast=Forecast.from_json(row.forecast) if row.forecast else None,
        fitted_at=row.fitted_at,
        version=version,
        current=row.version == version,
    )


def demand_forecast(
    *,
    weeks: list[dt.date],
    history: list[float],
    horizon: int = HORIZON_WEEKS,
    backtest_weeks: int = BACKTEST_WEEKS,
) -> Forecast | None:
    """Forecast `horizon` weeks after `history`; None with under MIN_HISTORY_WEEKS weeks.
    The back-test hides the last `backtest_weeks` (fewer on a short history) and forecasts them."""
    if len(history) < MIN_HISTORY_WEEKS:
        return None
    series = np.asarray(history, dtype=float)
    mean, lower, upper, name = _predict(series, horizon)
    backtest = min(backtest_weeks, len(history) - MIN_HISTORY_WEEKS + 2)
    mape = None
    predicted: list[float] = []
    if backtest >= 1:
        held_out, _lo, _hi, _name = _predict(series[:-backtest], backtest)
        predicted = [float(v) for v in held_out]
        mape = mape_pct(history[-backtest:], predicted)
    future = [weeks[-1] + dt.timedelta(days=7 * (i + 1)) for i in range(horizon)]
    return Forecast(
        history_weeks=weeks,
        history=history,
        weeks=future,
        mean=[float(v) for v in mean],
        lower=[float(v) for v in lower],
        upper=[float(v) for v in upper],
        model=name,
        backtest_mape_pct=mape,
        backtest_weeks=max(backtest, 0),
        backtest_actual=history[-backtest:] if backtest >= 1 else [],
        backtest_predicted=predicted,
    )

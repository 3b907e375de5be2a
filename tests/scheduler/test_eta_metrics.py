"""The replay's start-estimate metrics: what the portal's "likely between" ranges and the
per-horizon error are measured from."""

from __future__ import annotations

from scheduler.predict import JobFeatures
from scheduler.simulate.metrics import _eta_errors_by_horizon, _near_delay_band
from scheduler.simulate.workload import SimJob


def _job(index: int, submit: float, eta: float | None, start: float) -> SimJob:
    return SimJob(
        index=index,
        user="u",
        category="",
        queue="normal",
        gpus=1,
        shared_slot=False,
        submit=submit,
        duration=60.0,
        time_limit=3600.0,
        preemptible=False,
        features=JobFeatures("u", "img", "python train.py", 1),
        eta=eta,
        start=start,
        end=start + 60.0,
    )


def test_near_delay_band_is_the_quartiles_of_start_minus_estimate_for_near_estimates() -> None:
    # Estimated 10 min ahead, started 0..1,200 s after the estimate (step 100 s).
    near = [_job(i, 0.0, 600.0, 600.0 + 100.0 * i) for i in range(13)]
    # Far estimates and jobs without one do not count.
    far = [_job(100 + i, 0.0, 7200.0, 0.0 + i) for i in range(20)]
    none = [_job(200, 0.0, None, 50.0)]
    assert _near_delay_band(near + far + none) == (300, 900)


def test_near_delay_band_needs_ten_jobs() -> None:
    assert _near_delay_band([_job(i, 0.0, 600.0, 700.0) for i in range(9)]) is None


def test_errors_by_horizon_group_by_the_actual_wait() -> None:
    jobs = [
        _job(1, 0.0, 600.0, 1200.0),  # waited 20 min, 600 s off
        _job(2, 0.0, 3600.0, 7200.0),  # waited 2 h, 3,600 s off
        _job(3, 0.0, 600.0, 0.0),  # started at submit: not counted
    ]
    assert _eta_errors_by_horizon(jobs) == {"within_1h": 600.0, "within_1d": 3600.0, "later": None}

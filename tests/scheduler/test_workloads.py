"""The workload generator, and the simulator's honesty about what it replays."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import pytest

from scheduler.simulate.cli import main
from scheduler.simulate.run import simulate
from scheduler.simulate.workload import EmptyWorkload, auto_window_start
from scheduler.workloads import DAY, HOUR, PROFILES, generate, write

TRACE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "alibaba2023_openb_gpu.csv"


def test_the_generator_is_deterministic_per_seed() -> None:
    assert generate(PROFILES["wide"], 5) == generate(PROFILES["wide"], 5)
    assert generate(PROFILES["wide"], 5) != generate(PROFILES["wide"], 6)


def test_the_wide_profile_has_its_share_of_4_and_8_gpu_jobs() -> None:
    rows = generate(PROFILES["wide"], 1)
    widths = Counter(int(r["num_gpus"]) for r in rows)  # type: ignore[call-overload]
    wide = (widths[4] + widths[8]) / len(rows)
    assert 0.35 <= wide <= 0.65
    assert set(widths) <= {1, 2, 4, 8}


def test_arrivals_follow_the_day_and_the_week() -> None:
    rows = generate(PROFILES["lab"], 2)
    submits = [float(r["submit_time_s"]) for r in rows]  # type: ignore[arg-type]
    late_morning = sum(1 for t in submits if 10 <= (t % DAY) / HOUR < 12)
    small_hours = sum(1 for t in submits if 3 <= (t % DAY) / HOUR < 5)
    weekdays = sum(1 for t in submits if int(t // DAY) % 7 < 5) / 5
    weekend_days = sum(1 for t in submits if int(t // DAY) % 7 >= 5) / 2
    assert late_morning > 2 * small_hours
    assert weekdays > 1.5 * weekend_days


def test_demand_is_skewed_towards_a_few_users() -> None:
    rows = generate(PROFILES["lab"], 3)
    per_user = Counter(str(r["user"]) for r in rows).most_common()
    top_share = per_user[0][1] / len(rows)
    assert top_share > 3 / PROFILES["lab"].users


def test_run_times_are_heavy_tailed() -> None:
    runtimes = sorted(float(r["duration_s"]) for r in generate(PROFILES["wide"], 4))  # type: ignore[arg-type]
    median = runtimes[len(runtimes) // 2]
    assert runtimes[int(len(runtimes) * 0.99)] > 10 * median


def _trace(tmp_path: Path, rows: list[dict[str, object]]) -> str:
    path = str(tmp_path / "trace.csv")
    write(rows, path)
    return path


def _row(i: int, submit: float, gpus: int = 1, user: str = "NA") -> dict[str, object]:
    return {
        "job_id": f"j{i}",
        "user": user,
        "submit_time_s": submit,
        "start_time_s": submit,
        "duration_s": 600,
        "num_gpus": gpus,
        "gpu_frac": 1.0,
        "queue": "LS",
        "status": "Succeeded",
        "wait_s": 0,
    }


def test_the_simulator_uses_the_traces_own_users_when_it_names_them(tmp_path: Path) -> None:
    named = _trace(tmp_path, [_row(i, i * 60, user=f"ann{i % 3}") for i in range(30)])
    result = simulate(named, "labportal", gpus=8)
    assert result["users_source"] == "trace"

    anonymous = _trace(tmp_path, [_row(i, i * 60) for i in range(30)])
    assert simulate(anonymous, "labportal", gpus=8)["users_source"] == "synthesised"


def test_a_window_that_keeps_no_job_is_an_error_that_says_where_the_jobs_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _trace(tmp_path, [_row(i, 1000 + i * 60) for i in range(10)])
    with pytest.raises(EmptyWorkload, match="keeps none of the 10 jobs"):
        simulate(path, "fifo", gpus=8, window="5000000:6000000")

    assert main(["--trace", path, "--window", "9e9:", "--policy", "fifo"]) == 2
    assert "between 1000 s and 1540 s" in capsys.readouterr().err


def test_jobs_wider_than_any_node_are_refused_and_counted(tmp_path: Path) -> None:
    rows = [_row(i, i * 60, gpus=16 if i % 5 == 0 else 1) for i in range(20)]
    result = simulate(_trace(tmp_path, rows), "labportal", gpus=32, gpus_per_node=8)

    assert result["refused_too_wide"] == 4
    assert result["jobs"] == 16 and result["unfinished"] == 0


def test_quiet_days_count_for_nothing_in_the_contention_weighted_jain(tmp_path: Path) -> None:
    rows = [_row(i, i * 3600, user=f"u{i % 2}") for i in range(48)]  # never contested
    result = simulate(_trace(tmp_path, rows), "labportal", gpus=8)

    assert result["wait_mean_s"] == 0
    assert result["jain_contention"] is None
    assert set(result["eta_error_median_s_by_horizon"]) == {"within_1h", "within_1d", "later"}


def test_the_auto_window_skips_a_sparse_head_and_keeps_the_rest() -> None:
    head = [0.0, 1e6, 5e6]
    dense = [9e6 + i * 10 for i in range(1000)]
    assert auto_window_start(head + dense) == 9e6
    assert auto_window_start(dense) == 9e6


@pytest.mark.skipif(not TRACE.exists(), reason="shared trace not present")
def test_the_default_window_on_the_development_trace_is_its_dense_part() -> None:
    with open(TRACE, newline="") as handle:
        submits = [
            float(r["submit_time_s"])
            for r in csv.DictReader(handle)
            if r["duration_s"] and r["start_time_s"]
        ]
    start = auto_window_start(submits)
    assert 8e6 <= start <= 1e7
    assert sum(1 for t in submits if t >= start) > 6000

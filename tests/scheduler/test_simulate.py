"""Quick simulator runs on a short slice of the shared trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.scheduler import main as bench_main
from scheduler.simulate.cli import main
from scheduler.simulate.run import POLICIES, simulate
from scheduler.simulate.workload import round_up_to_standard_limit

TRACE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "alibaba2023_openb_gpu.csv"
KEYS = {
    "policy",
    "gpus",
    "jobs",
    "allocation",
    "wait_mean_s",
    "wait_p50_s",
    "wait_p95_s",
    "wait_p95_s_by_queue",
    "jct_mean_s",
    "bounded_slowdown_mean",
    "jain",
    "eta_error_median_s",
    "runtime_error_median",
    "sim_seconds",
}

needs_trace = pytest.mark.skipif(not TRACE.exists(), reason="shared trace not present")


def test_it_rounds_time_limits_up_to_the_next_standard_limit() -> None:
    assert round_up_to_standard_limit(59) == 600
    assert round_up_to_standard_limit(3600) == 3600
    assert round_up_to_standard_limit(3601) == 7200
    assert round_up_to_standard_limit(8 * 86_400 + 1) == 9 * 86_400


@needs_trace
@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_replays_a_short_slice_to_completion(policy: str) -> None:
    result = simulate(str(TRACE), policy, gpus=16, max_jobs=200, load=2.0)
    assert set(result) >= KEYS
    assert result["jobs"] == 200
    assert result["unfinished"] == 0
    assert result["policy"] == policy


@needs_trace
def test_it_prints_one_json_object_with_the_documented_keys(
    capsys: pytest.CaptureFixture[str],
) -> None:
    main(["--trace", str(TRACE), "--max-jobs", "150", "--gpus", "16", "--json"])
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert set(json.loads(line)) >= KEYS


@needs_trace
def test_labportal_waits_less_than_strict_fifo_under_contention() -> None:
    lab = simulate(str(TRACE), "labportal", gpus=8, max_jobs=300, load=3.0)
    fifo = simulate(str(TRACE), "fifo", gpus=8, max_jobs=300, load=3.0)
    assert lab["wait_mean_s"] <= fifo["wait_mean_s"]  # type: ignore[operator]


def test_bench_prints_one_json_object_per_size(capsys: pytest.CaptureFixture[str]) -> None:
    bench_main(
        [
            "--pending",
            "200",
            "--gpus",
            "64",
            "--reservations",
            "10",
            "--sizes",
            "100",
            "--repeats",
            "1",
            "--json",
        ]
    )
    lines = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
    assert [row["pending"] for row in lines] == [100, 200]
    for row in lines:
        assert {"pending", "gpus", "reservations", "pass_median_s", "pass_p95_s"} <= set(row)


def test_a_missing_trace_is_a_usage_error_that_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-trace.csv"
    with pytest.raises(SystemExit) as exited:
        main(["--trace", str(missing)])
    assert exited.value.code == 2
    assert f"--trace {missing} is not a file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        bench_main(["--pending", "10", "--sizes", "", "--quality", "--trace", str(missing)])
    assert exited.value.code == 2
    assert f"--trace {missing}, which is not a file" in capsys.readouterr().err


def test_the_bench_finds_the_shared_trace_from_any_working_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from benchmarks.scheduler import DEFAULT_TRACE

    monkeypatch.chdir(tmp_path)
    assert DEFAULT_TRACE.resolve() == TRACE.resolve()

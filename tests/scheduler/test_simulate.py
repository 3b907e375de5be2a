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
    assert lab["wait_mean_s"] <= fifo["wait_mean_s"]


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


def write_trace(path: Path, rows: list[tuple[int, float, float, float]]) -> str:
    """A trace CSV of (submit s, duration s, GPUs, GPU fraction) rows."""
    lines = [
        "job_id,user,submit_time_s,start_time_s,duration_s,num_gpus,gpu_frac,queue,status,wait_s"
    ]
    for i, (submit, duration, gpus, frac) in enumerate(rows):
        lines.append(f"j{i},u{i % 3},{submit},{submit},{duration},{gpus},{frac},LS,Done,0")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_workload_without_slot_jobs_gets_no_slot_gpu_and_its_widest_jobs_run(
    tmp_path: Path,
) -> None:
    # Whole-GPU jobs only, two of them as wide as the 8-GPU cluster: with a GPU exposed as
    # shared slots, no job could use it and the 8-GPU jobs could never start.
    trace = write_trace(
        tmp_path / "wide.csv", [(0, 600, 8, 1.0), (10, 300, 2, 1.0), (20, 600, 8, 1.0)]
    )
    result = simulate(trace, "labportal", gpus=8, gpus_per_node=8, window="all")
    assert result["slot_gpus"] == 0
    assert result["unfinished"] == 0 and result["jobs"] == 3

    forced = simulate(trace, "fifo", gpus=8, gpus_per_node=8, window="all", slot_gpus=1)
    assert forced["slot_gpus"] == 1
    assert forced["unfinished"] == 2, "the two 8-GPU jobs cannot fit beside a slot GPU"


def test_fractional_jobs_too_long_for_the_debug_queue_are_counted_as_whole_gpu_jobs(
    tmp_path: Path,
) -> None:
    # A 0.5-GPU job of 10 minutes is a debug slot job; one of 5 hours is replayed as a
    # whole-GPU normal job, and the result says how many were.
    trace = write_trace(
        tmp_path / "frac.csv",
        [(0, 300, 1, 0.5), (5, 5 * 3600, 1, 0.5), (9, 6 * 3600, 1, 0.25), (12, 60, 2, 1.0)],
    )
    result = simulate(trace, "labportal", gpus=8, gpus_per_node=8, window="all")
    assert result["fractional_as_whole"] == 2
    assert result["slot_gpus"] == 1, "the short fractional job uses a shared slot"
    assert result["unfinished"] == 0

"""Parsing Slurm 22.05's JSON and text outputs (recorded from the test cluster), and the JWT."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import jwt

from slurm.cli import (
    gpu_count,
    mint_token,
    parse_jobs_json,
    parse_nodes_json,
    parse_partitions_json,
    parse_sacct_json,
    parse_scontrol_partitions,
    parse_slurm_duration,
    parse_squeue_start,
)

DATA = Path(__file__).parent / "data"


def test_gpu_count_reads_gres_and_tres_strings() -> None:
    assert gpu_count("gpu:2") == (2, "")
    assert gpu_count("gres:gpu:1") == (1, "")
    assert gpu_count("gpu:a100:4(S:0-1)") == (4, "a100")
    assert gpu_count("gres/gpu=3") == (3, "")
    assert gpu_count("gpu:a100:2(S:0),gpu:h100:1(S:1)") == (3, "a100")
    assert gpu_count("") == (0, "")
    assert gpu_count("(null)") == (0, "")
    assert gpu_count("gpu:a100:2(S:0,1),gpu:h100:1(S:1)") == (3, "a100")


def test_gpu_count_splits_a_long_gres_list_in_one_pass() -> None:
    # Looking ahead for a ")" from each comma, as the old split did, rescans the rest
    # of the text at each of the 500,000 commas: minutes, not a fraction of a second.
    assert gpu_count("gpu:1," * 500_000) == (500_000, "")


def test_it_parses_each_state_of_squeue_json() -> None:
    jobs = {j.name: j for j in parse_jobs_json((DATA / "squeue.json").read_text())}
    assert jobs["done"].state == "COMPLETED" and jobs["done"].exit_code == 0
    assert jobs["fails"].state == "FAILED" and jobs["fails"].exit_code == 3
    assert jobs["fails"].reason == "NonZeroExitCode"
    running = jobs["running"]
    assert running.state == "RUNNING" and running.gpus == 2 and running.ended_at is None
    assert running.started_at is not None and running.time_limit_s == 600
    assert running.output_path.endswith(f"/o-{running.job_id}.out")
    assert jobs["pending"].state == "PENDING" and jobs["pending"].reason == "Resources"
    assert jobs["pending"].started_at is None and jobs["pending"].exit_code is None
    assert jobs["held"].reason == "JobHeldUser"
    assert {j.user for j in jobs.values()} == {"nobody"}


def test_slurmrestd_jobs_parse_like_squeue() -> None:
    jobs = parse_jobs_json((DATA / "rest_jobs.json").read_text())
    assert {j.state for j in jobs} >= {"COMPLETED", "RUNNING", "PENDING"}


def test_it_parses_sacct_json_with_tres_and_failed_exit_codes() -> None:
    jobs = {j.name: j for j in parse_sacct_json((DATA / "sacct.json").read_text())}
    assert jobs["done"].state == "COMPLETED" and jobs["done"].qos == "debug"
    assert jobs["done"].account == "lab" and jobs["done"].gpus == 1
    assert jobs["running"].state == "CANCELLED" and jobs["running"].gpus == 2
    assert jobs["running"].elapsed_s == 3 and jobs["running"].tres["cpu"] == 1
    assert jobs["done"].ended_at == datetime.fromtimestamp(1796108899, tz=UTC)


def test_it_parses_nodes_from_sinfo_and_slurmrestd() -> None:
    for name in ("sinfo.json", "rest_nodes.json"):
        (node,) = parse_nodes_json((DATA / name).read_text())
        assert node.gpus == 2 and node.partitions == ("lab",)
        assert node.state == "mixed" and node.cpus == 16 and node.address == "127.0.0.1"


def test_it_parses_newer_list_states_with_drain_flags() -> None:
    (node,) = parse_nodes_json({"nodes": [{"name": "n1", "state": ["IDLE", "DRAIN"]}]})
    assert node.state == "idle" and node.flags == ("DRAIN",)


def test_it_parses_partitions_from_slurmrestd_and_scontrol() -> None:
    (rest,) = parse_partitions_json((DATA / "rest_partitions.json").read_text())
    assert rest.name == "lab" and rest.is_default and rest.max_time_s is None
    line = (
        "PartitionName=gpu AllowGroups=ALL Default=NO MaxTime=2-00:00:00 Nodes=n[1-4] "
        "State=DRAIN TotalCPUs=64\nPartitionName=debug Default=YES MaxTime=30 State=UP\n"
    )
    gpu, debug = parse_scontrol_partitions(line)
    assert (gpu.name, gpu.state, gpu.is_default, gpu.max_time_s) == ("gpu", "DRAIN", False, 172800)
    assert gpu.nodes == "n[1-4]"
    assert (debug.is_default, debug.max_time_s) == (True, 1800)


def test_slurm_durations() -> None:
    assert parse_slurm_duration("UNLIMITED") is None
    assert parse_slurm_duration("30") == 1800
    assert parse_slurm_duration("1:00:00") == 3600
    assert parse_slurm_duration("1-02:03:04") == 93784
    assert parse_slurm_duration("1-02") == 93600


def test_squeue_start_keeps_only_real_estimates() -> None:
    starts = parse_squeue_start(
        (DATA / "squeue_start.txt").read_text() + "7|2026-12-01T10:00:00|Priority\n"
    )
    assert list(starts) == [7]
    assert starts[7].tzinfo is not None


def test_the_token_is_slurms_hs256_jwt_for_the_unix_user() -> None:
    key = b"k" * 32
    token = mint_token(key=key, unix_user="alice", lifetime_s=60)
    claims = jwt.decode(token, key, algorithms=["HS256"])
    assert claims["sun"] == "alice" and claims["exp"] - claims["iat"] == 60

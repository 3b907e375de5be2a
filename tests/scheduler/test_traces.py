"""Public trace converters: Helios's cluster_log.csv, Philly's cluster_job_log and
AdaptDL's philly.csv."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from scheduler.simulate.run import simulate
from scheduler.traces import (
    COLUMNS,
    TraceError,
    convert_helios,
    convert_philly,
    convert_philly_csv,
    main,
)

HELIOS = """job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue
j1,ualice,vcA,8,64,1,COMPLETED,2020-04-01 00:00:10,2020-04-01 00:01:10,2020-04-01 02:01:10,7200,60
j0,ubob,vcB,1,8,1,FAILED,2020-04-01 00:00:00,2020-04-01 00:00:30,2020-04-01 00:10:30,600,30
cpu,ubob,vcB,0,4,1,COMPLETED,2020-04-01 00:00:20,2020-04-01 00:00:20,2020-04-01 00:05:20,300,0
never,ualice,vcA,4,32,1,CANCELLED,2020-04-01 00:00:30,,,0,0
j2,ualice,vcA,16,128,2,COMPLETED,2020-04-01 00:02:00,2020-04-01 03:00:00,2020-04-01 04:00:00,3600,10680
"""


def test_helios_rows_become_the_simulators_columns_with_their_own_users_and_waits() -> None:
    result = convert_helios(io.StringIO(HELIOS))
    assert [r["job_id"] for r in result.rows] == ["j0", "j1", "j2"]  # by submit time
    j0, j1, j2 = result.rows
    assert (j0["submit_time_s"], j0["start_time_s"], j0["duration_s"], j0["wait_s"]) == (
        0,
        30,
        600,
        30,
    )
    assert (j1["submit_time_s"], j1["start_time_s"], j1["duration_s"], j1["wait_s"]) == (
        10,
        70,
        7200,
        60,
    )
    assert (j1["user"], j1["num_gpus"], j1["queue"], j1["status"]) == (
        "ualice",
        8,
        "vcA",
        "COMPLETED",
    )
    assert j2["num_gpus"] == 16 and j2["wait_s"] == 3 * 3600 - 120
    assert result.dropped == {"without GPUs": 1, "never started": 1}


def test_one_virtual_cluster_can_be_kept() -> None:
    result = convert_helios(io.StringIO(HELIOS), vc="vcB")
    assert [r["job_id"] for r in result.rows] == ["j0"]
    assert result.dropped["in another virtual cluster"] == 3


def test_a_file_that_is_not_a_helios_log_is_refused_with_what_is_missing() -> None:
    with pytest.raises(TraceError, match="no column gpu_num"):
        convert_helios(io.StringIO("job_id,user,vc,submit_time\n1,a,b,0\n"))
    bad_time = HELIOS.replace("2020-04-01 00:00:10", "yesterday", 1)
    with pytest.raises(TraceError, match="line 2: time 'yesterday'"):
        convert_helios(io.StringIO(bad_time))
    with pytest.raises(TraceError, match="no job with GPUs"):
        convert_helios(io.StringIO(HELIOS), vc="nobody")


PHILLY = [
    {
        "jobid": "application_1",
        "user": "6214e9",
        "vc": "ee9e8c",
        "status": "Pass",
        "submitted_time": "2017-10-03 02:52:40",
        "attempts": [
            {
                "start_time": "2017-10-03 02:53:00",
                "end_time": "2017-10-03 03:00:00",
                "detail": [{"ip": "m1", "gpus": ["gpu0", "gpu1"]}],
            },
            {
                "start_time": "2017-10-03 03:10:00",
                "end_time": "2017-10-03 05:10:00",
                "detail": [
                    {"ip": "m1", "gpus": ["gpu0", "gpu1", "gpu2", "gpu3"]},
                    {"ip": "m2", "gpus": ["gpu0", "gpu1", "gpu2", "gpu3"]},
                ],
            },
        ],
    },
    {
        "jobid": "application_2",
        "user": "11cb48",
        "vc": "ee9e8c",
        "status": "Killed",
        "submitted_time": "2017-10-03 02:50:40",
        "attempts": [],
    },
    {
        "jobid": "application_3",
        "user": "11cb48",
        "vc": "b436b2",
        "status": "Failed",
        "submitted_time": "2017-10-03 02:52:00",
        "attempts": [
            {
                "start_time": "2017-10-03 02:52:05",
                "end_time": "None",
                "detail": [{"ip": "m3", "gpus": ["gpu0"]}],
            }
        ],
    },
    {
        "jobid": "application_4",
        "user": "11cb48",
        "vc": "b436b2",
        "status": "Pass",
        "submitted_time": "2017-10-03 02:51:00",
        "attempts": [
            {
                "start_time": "2017-10-03 02:51:30",
                "end_time": "2017-10-03 02:56:30",
                "detail": [{"ip": "m3", "gpus": ["gpu0"]}],
            }
        ],
    },
]


def test_philly_jobs_replay_their_last_attempt_with_the_earlier_ones_as_wait() -> None:
    result = convert_philly(PHILLY)
    assert [r["job_id"] for r in result.rows] == ["application_4", "application_1"]
    first, retried = result.rows
    assert (first["submit_time_s"], first["duration_s"], first["num_gpus"]) == (0, 300, 1)
    # Submitted 100 s after the first kept job; the last attempt began 17 min 20 s later
    # and held 8 GPUs on two machines for two hours.
    assert retried["submit_time_s"] == 100
    assert retried["wait_s"] == 17 * 60 + 20
    assert (retried["num_gpus"], retried["duration_s"], retried["user"]) == (8, 7200, "6214e9")
    assert result.dropped == {"never started": 1, "without an end": 1}


def test_philly_input_that_is_not_a_job_list_is_refused() -> None:
    with pytest.raises(TraceError, match="JSON list"):
        convert_philly({"jobs": []})
    with pytest.raises(TraceError, match="job 0: not a Philly job"):
        convert_philly([{"jobid": "x"}])


def test_the_command_writes_a_trace_the_simulator_replays_with_the_traces_users(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "cluster_log.csv"
    lines = [
        "job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue"
    ]
    for i in range(40):
        user = ("ann", "ben", "cai")[i % 3]
        gpus = (1, 2, 4, 8)[i % 4]
        submit = f"2020-04-01 {i // 6:02d}:{(i * 7) % 60:02d}:00"
        lines.append(
            f"{i},{user},vcA,{gpus},8,1,COMPLETED,{submit},{submit},2020-04-02 00:00:00,0,0"
        )
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "helios.csv"
    assert main(["helios", str(source), str(out)]) == 0
    assert "40 jobs of 3 users (30 with more than one GPU)" in capsys.readouterr().out
    with out.open() as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames or ()) == COLUMNS
        assert len(list(reader)) == 40
    result = simulate(str(out), "fifo", gpus=16, gpus_per_node=8, window="all")
    assert result["users_source"] == "trace"
    assert result["jobs"] == 40


def test_the_command_names_a_missing_or_broken_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["philly", str(tmp_path / "nope.json"), str(tmp_path / "o.csv")]) == 2
    assert "is not a file" in capsys.readouterr().err
    broken = tmp_path / "cluster_job_log"
    broken.write_text("[{")
    assert main(["philly", str(broken), str(tmp_path / "o.csv")]) == 2
    assert "not JSON" in capsys.readouterr().err
    broken.write_text(json.dumps(PHILLY))
    assert main(["philly", str(broken), str(tmp_path / "o.csv")]) == 0


# AdaptDL's philly.csv shape: rows out of time order, a team (virtual cluster) per row.
PHILLY_CSV = """timestamp,duration,num_gpus,gpu_time,cluster
2017-10-09 06:00:00,3600.0,1,3600.0,teamA
2017-10-09 05:00:00,600.0,8,4800.0,teamB
2017-10-09 05:30:00,0.0,1,0.0,teamA
2017-10-09 05:40:00,120.0,0,0.0,teamB
2017-10-09 05:50:00,-5.0,2,-10.0,teamA
2017-10-09 05:10:00,,4,,teamC
2017-10-09 05:20:00,1800.0,16,28800.0,teamC
"""


def test_adaptdl_philly_rows_become_jobs_with_their_team_as_user_in_time_order() -> None:
    result = convert_philly_csv(io.StringIO(PHILLY_CSV))
    assert [r["job_id"] for r in result.rows] == ["L3", "L8", "L2"]  # by submit, ids = lines
    b, c, a = result.rows
    assert (b["user"], b["queue"], b["num_gpus"], b["submit_time_s"], b["duration_s"]) == (
        "teamB",
        "teamB",
        8,
        0,
        600,
    )
    assert (c["submit_time_s"], c["num_gpus"], a["submit_time_s"], a["duration_s"]) == (
        1200,
        16,
        3600,
        3600,
    )
    # No start time in the trace: the start repeats the submit, the production wait is unknown.
    assert all(r["start_time_s"] == r["submit_time_s"] and r["wait_s"] == "" for r in result.rows)
    assert result.dropped == {
        "that ran for no time": 2,
        "without GPUs": 1,
        "without a run time": 1,
    }


def test_adaptdl_philly_keeps_one_team_and_refuses_what_is_not_its_csv() -> None:
    result = convert_philly_csv(io.StringIO(PHILLY_CSV), vc="teamA")
    assert [r["job_id"] for r in result.rows] == ["L2"]
    assert result.dropped["in another virtual cluster"] == 4
    with pytest.raises(TraceError, match="no column timestamp"):
        convert_philly_csv(io.StringIO("time,duration,num_gpus,cluster\n"))
    with pytest.raises(TraceError, match="line 2: duration 'long'"):
        convert_philly_csv(io.StringIO(PHILLY_CSV.replace("3600.0,1,", "long,1,", 1)))
    with pytest.raises(TraceError, match="line 2: num_gpus 'x'"):
        convert_philly_csv(io.StringIO(PHILLY_CSV.replace("3600.0,1,", "3600.0,x,", 1)))


def test_the_simulator_replays_adaptdl_philly_with_teams_as_users_and_refuses_wide_jobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "philly.csv"
    source.write_text(PHILLY_CSV)
    out = tmp_path / "philly-sim.csv"
    assert main(["philly-csv", str(source), str(out)]) == 0
    printed = capsys.readouterr().out
    assert "3 jobs of 3 virtual clusters as users (2 with more than one GPU)" in printed
    assert "dropped 2 that ran for no time" in printed
    result = simulate(str(out), "fifo", gpus=16, gpus_per_node=8, window="all")
    assert result["users_source"] == "trace"
    assert (result["jobs"], result["refused_too_wide"]) == (2, 1)  # the 16-GPU job is refused

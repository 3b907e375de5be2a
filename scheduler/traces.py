"""Convert public GPU-cluster traces into the simulator's CSV, for held-out replays.

    python -m scheduler.traces helios  PATH/TO/cluster_log.csv      OUT.csv [--vc NAME]
    python -m scheduler.traces philly  PATH/TO/cluster_job_log      OUT.csv [--vc NAME]
    python -m scheduler.traces philly-csv PATH/TO/philly.csv        OUT.csv [--vc NAME]
    python -m scheduler.simulate --trace OUT.csv --gpus 64 --policy all

The traces are not kept in this repository; fetch them from their publishers:

- **helios**: SenseTime's Helios traces (Hu et al., "Characterization and Prediction of
  Deep Learning Workloads in Large-Scale GPU Datacenters", SC'21), published by the
  S-Lab System Group as ``HeliosData`` (CC BY 4.0). One ``cluster_log.csv`` per cluster
  (Venus, Earth, Saturn, Uranus; Philly's log is also given in this shape), with the header
  ``job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue``
  and times as ``YYYY-MM-DD HH:MM:SS``.
- **philly**: Microsoft's Philly traces (Jeon et al., "Analysis of Large-Scale
  Multi-Tenant GPU Clusters for DNN Training Workloads", ATC'19), published by
  ``msr-fiddle/philly-traces``. ``cluster_job_log`` is a JSON list of jobs, each with
  ``jobid``, ``user``, ``vc``, ``status``, ``submitted_time`` and ``attempts`` (each
  attempt: ``start_time``, ``end_time`` and ``detail``, the GPUs it held per machine).
- **philly-csv**: the same Philly trace as preprocessed by the AdaptDL/Pollux project
  (Qiao et al., OSDI'21): the file ``simulator/traces/philly.csv`` of the
  ``petuum/adaptdl`` repository, one job a row with the header
  ``timestamp,duration,num_gpus,gpu_time,cluster``: the submit time (``YYYY-MM-DD
  HH:MM:SS``), the run time in seconds, the GPUs, GPUs × run time, and the Philly virtual
  cluster (VC), that is, a team. Its rows are not in time order.

The output has the columns of ``shared/traces`` (see its README):
``job_id,user,submit_time_s,start_time_s,duration_s,num_gpus,gpu_frac,queue,status,wait_s``.
Seconds count from the first kept job's submit. Helios and Philly's JSON name their
users, so the simulator replays them with the trace's own users (its output says
``users: trace``). The AdaptDL CSV has no user column: each virtual cluster (team) stands
for one user, so fair share is between teams, and the simulator still says
``users: trace``. Nor does it say when a job started: ``start_time_s`` repeats the submit
(the simulator needs a start to know the job ran) and ``wait_s`` is left empty, unknown.
The virtual cluster goes in ``queue`` (it is the simulator's feature for run-time
prediction). Jobs without GPUs, or that never ran, are dropped and counted; a Philly job
that ran more than once is replayed as its last attempt (the one that ended it), with the
earlier attempts' time added to its wait, as the member experienced it.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from scheduler.workloads import FIELDS

COLUMNS = tuple(FIELDS)  # the simulator's trace columns, as shared/traces has them

HELIOS_COLUMNS = (
    "job_id",
    "user",
    "vc",
    "gpu_num",
    "submit_time",
    "start_time",
    "end_time",
    "duration",
    "state",
)
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


class TraceError(ValueError):
    """The input is not the trace it was said to be; the message says what is wrong."""


@dataclass
class Converted:
    """Rows in the simulator's columns, and what was dropped and why."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)

    def drop(self, why: str) -> None:
        self.dropped[why] = self.dropped.get(why, 0) + 1


@dataclass(frozen=True)
class _Job:
    job_id: str
    user: str
    vc: str
    gpus: int
    submit: float
    start: float
    end: float
    status: str


def _epoch(text: str | None, *, where: str) -> float | None:
    """A trace time as epoch seconds (the traces' wall clock, read as UTC); None if absent."""
    if text is None:
        return None
    text = str(text).strip()
    if text in ("", "None", "null", "NaN", "nan"):
        return None
    try:
        return float(text)  # already seconds
    except ValueError:
        pass
    try:
        return datetime.strptime(text, TIME_FORMAT).replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise TraceError(
            f"{where}: time {text!r} is neither seconds nor {TIME_FORMAT.replace('%', '')}"
        ) from None


def _finish(jobs: Iterable[_Job], result: Converted) -> Converted:
    kept = sorted(jobs, key=lambda j: (j.submit, j.job_id))
    if not kept:
        reasons = ", ".join(f"{n} {why}" for why, n in sorted(result.dropped.items()))
        raise TraceError(f"no job with GPUs and a run time is left to replay ({reasons})")
    t0 = kept[0].submit
    for job in kept:
        start = max(job.start, job.submit)
        result.rows.append(
            {
                "job_id": job.job_id,
                "user": job.user,
                "submit_time_s": round(job.submit - t0),
                "start_time_s": round(start - t0),
                "duration_s": round(job.end - start),
                "num_gpus": job.gpus,
                "gpu_frac": 1.0,
                "queue": job.vc or "default",
                "status": job.status,
                "wait_s": round(start - job.submit),
            }
        )
    return result


def _csv_with(lines: Iterable[str], columns: Iterable[str], what: str) -> csv.DictReader[str]:
    """A CSV reader over ``lines``, refused unless its header has every column."""
    reader = csv.DictReader(lines)
    missing = [c for c in columns if c not in (reader.fieldnames or ())]
    if missing:
        raise TraceError(
            f"not {what}: no column {', '.join(missing)} "
            f"(found {', '.join(reader.fieldnames or ()) or 'no header'})"
        )
    return reader


def _gpu_count(row: dict[str, str], column: str, where: str) -> int:
    """The GPUs in ``row[column]`` (empty counts as none); a non-number stops the conversion."""
    try:
        return int(float(row[column] or 0))
    except ValueError:
        raise TraceError(f"{where}: {column} {row[column]!r} is not a number") from None


def convert_helios(lines: Iterable[str], *, vc: str | None = None) -> Converted:
    """Helios ``cluster_log.csv`` (or Philly's log in Helios's shape) → simulator rows."""
    reader = _csv_with(lines, HELIOS_COLUMNS, "a Helios cluster_log.csv")
    result = Converted()

    def jobs() -> Iterator[_Job]:
        for line_no, row in enumerate(reader, start=2):
            where = f"line {line_no}"
            if vc is not None and row["vc"] != vc:
                result.drop("in another virtual cluster")
                continue
            gpus = _gpu_count(row, "gpu_num", where)
            if gpus <= 0:
                result.drop("without GPUs")
                continue
            submit = _epoch(row["submit_time"], where=where)
            start = _epoch(row["start_time"], where=where)
            end = _epoch(row["end_time"], where=where)
            if submit is None:
                result.drop("without a submit time")
                continue
            if start is None:
                result.drop("never started")
                continue
            if end is None:
                try:
                    end = start + float(row["duration"])
                except ValueError:
                    result.drop("without an end")
                    continue
            if end <= start:
                result.drop("that ran for no time")
                continue
            yield _Job(
                row["job_id"], row["user"], row["vc"], gpus, submit, start, end, row["state"]
            )

    return _finish(list(jobs()), result)


def convert_philly(data: Any, *, vc: str | None = None) -> Converted:
    """Philly's ``cluster_job_log`` (a JSON list of jobs) → simulator rows."""
    if not isinstance(data, list):
        raise TraceError("not a Philly cluster_job_log: expected a JSON list of jobs")
    result = Converted()
    jobs: list[_Job] = []
    for index, job in enumerate(data):
        where = f"job {index}"
        if not isinstance(job, dict) or "attempts" not in job or "submitted_time" not in job:
            raise TraceError(f"{where}: not a Philly job (needs submitted_time and attempts)")
        if vc is not None and job.get("vc") != vc:
            result.drop("in another virtual cluster")
            continue
        attempts = [a for a in job["attempts"] or [] if isinstance(a, dict)]
        submit = _epoch(job["submitted_time"], where=where)
        if submit is None:
            result.drop("without a submit time")
            continue
        if not attempts:
            result.drop("never started")
            continue
        last = attempts[-1]
        start = _epoch(last.get("start_time"), where=where)
        end = _epoch(last.get("end_time"), where=where)
        gpus = sum(len(d.get("gpus") or []) for d in last.get("detail") or [])
        if gpus <= 0:
            result.drop("without GPUs")
            continue
        if start is None or end is None:
            result.drop("never started" if start is None else "without an end")
            continue
        if end <= start:
            result.drop("that ran for no time")
            continue
        jobs.append(
            _Job(
                str(job.get("jobid", index)),
                str(job.get("user") or ""),
                str(job.get("vc") or ""),
                gpus,
                submit,
                start,
                end,
                str(job.get("status") or ""),
            )
        )
    return _finish(jobs, result)


PHILLY_CSV_COLUMNS = ("timestamp", "duration", "num_gpus", "cluster")


def convert_philly_csv(lines: Iterable[str], *, vc: str | None = None) -> Converted:
    """AdaptDL's ``philly.csv`` (``petuum/adaptdl``, ``simulator/traces/philly.csv``) → rows.

    One job a row: submitted at ``timestamp`` (UTC), running ``duration`` seconds on
    ``num_gpus`` GPUs. The trace has no user column, so the virtual cluster (``cluster``,
    a team) is the user as well as the queue. Job ids are ``L<line number>`` in the source.
    Rows without GPUs, without a submit time or run time, or that ran for no time are
    dropped and counted; a row whose numbers are not numbers stops the conversion.
    """
    reader = _csv_with(lines, PHILLY_CSV_COLUMNS, "AdaptDL's philly.csv")
    result = Converted()
    jobs: list[_Job] = []
    for line_no, row in enumerate(reader, start=2):
        where = f"line {line_no}"
        team = (row["cluster"] or "").strip()
        if vc is not None and team != vc:
            result.drop("in another virtual cluster")
            continue
        gpus = _gpu_count(row, "num_gpus", where)
        if gpus <= 0:
            result.drop("without GPUs")
            continue
        submit = _epoch(row["timestamp"], where=where)
        if submit is None:
            result.drop("without a submit time")
            continue
        text = (row["duration"] or "").strip()
        if text in ("", "None", "null", "NaN", "nan"):
            result.drop("without a run time")
            continue
        try:
            duration = float(text)
        except ValueError:
            raise TraceError(f"{where}: duration {text!r} is not a number") from None
        if not duration > 0:
            result.drop("that ran for no time")
            continue
        jobs.append(_Job(f"L{line_no}", team, team, gpus, submit, submit, submit + duration, ""))
    converted = _finish(jobs, result)
    for out in converted.rows:
        out["wait_s"] = ""  # the trace does not say when the job started
    return converted


def write_csv(result: Converted, out: IO[str]) -> None:
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(result.rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scheduler.traces",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "format",
        choices=("helios", "philly", "philly-csv"),
        help="philly-csv: AdaptDL's philly.csv, whose virtual clusters (teams) stand for users",
    )
    parser.add_argument("source", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--vc", default=None, help="keep one virtual cluster only")
    args = parser.parse_args(argv)
    if not args.source.is_file():
        print(f"traces: {args.source} is not a file", file=sys.stderr)
        return 2
    try:
        with args.source.open(newline="", encoding="utf-8") as handle:
            if args.format == "helios":
                result = convert_helios(handle, vc=args.vc)
            elif args.format == "philly-csv":
                result = convert_philly_csv(handle, vc=args.vc)
            else:
                try:
                    data = json.load(handle)
                except json.JSONDecodeError as exc:
                    raise TraceError(f"not JSON ({exc})") from None
                result = convert_philly(data, vc=args.vc)
    except TraceError as exc:
        print(f"traces: {args.source}: {exc}", file=sys.stderr)
        return 2
    with args.out.open("w", newline="", encoding="utf-8") as out:
        write_csv(result, out)
    users = len({r["user"] for r in result.rows})
    wide = sum(1 for r in result.rows if int(r["num_gpus"]) > 1)
    who = "virtual clusters as users" if args.format == "philly-csv" else "users"
    print(
        f"{args.out}: {len(result.rows)} jobs of {users} {who} "
        f"({wide} with more than one GPU) from {args.format} {args.source}"
    )
    for why, count in sorted(result.dropped.items()):
        print(f"  dropped {count} {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

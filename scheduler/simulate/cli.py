"""The command line of the trace simulator (``python -m scheduler.simulate --help``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import scheduler.simulate
from scheduler.simulate.run import POLICIES, simulate
from scheduler.simulate.workload import EmptyWorkload


def format_table(results: Iterable[dict[str, Any]]) -> str:
    """Metrics side by side, one column per policy."""
    results = list(results)
    keys = [k for k in results[0] if k != "policy"]
    width = max(len(k) for k in keys) + 2

    def cell(value: object) -> str:
        if isinstance(value, dict):
            return " ".join(f"{q}={v}" for q, v in value.items())
        return str(value)

    column = max(16, *(len(cell(r[k])) + 2 for r in results for k in keys))
    lines = ["".ljust(width) + "".join(str(r["policy"]).rjust(column) for r in results)]
    for key in keys:
        lines.append(key.ljust(width) + "".join(cell(r[key]).rjust(column) for r in results))
    return "\n".join(lines)


def _seconds(value: float | None, unit: float) -> float | None:
    return value * unit if value is not None else None


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; prints a table, or one JSON object per policy."""
    parser = argparse.ArgumentParser(
        prog="python -m scheduler.simulate",
        description=scheduler.simulate.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--trace", required=True)
    parser.add_argument("--gpus", type=int, default=32)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--policy", default="labportal", choices=(*POLICIES, "all"))
    parser.add_argument("--users", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--load", type=float, default=1.0)
    parser.add_argument(
        "--window",
        default="auto",
        help="auto (skip a sparse head; the default) | dense | all | START:END (trace seconds)",
    )
    parser.add_argument("--max-jobs", type=int, default=None)
    parser.add_argument(
        "--slot-gpus",
        type=int,
        default=None,
        help="GPUs exposed as shared slots (default: 1 if the workload has jobs that use "
        "slots, else 0)",
    )
    parser.add_argument("--slots-per-gpu", type=int, default=4)
    parser.add_argument("--timeslot-hours", type=float, default=4.0)
    parser.add_argument(
        "--preempt-starving-hours",
        type=float,
        default=None,
        help="LabPortal only: a job waiting this long may requeue others' preemptible jobs "
        "(the portal's default is 12; off when not given)",
    )
    parser.add_argument(
        "--preempt-share-minutes",
        type=float,
        default=None,
        help="LabPortal only: a member at or under their share, waiting this long, may "
        "requeue preemptible jobs of members over theirs (the portal's default is 10)",
    )
    parser.add_argument(
        "--preempt-max-times",
        type=int,
        default=None,
        help="LabPortal only: a job preempted this many times is no longer stopped for a "
        "starving job or a member's share (the portal's default is 2; no cap when not given)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.preempt_max_times is not None and args.preempt_max_times < 0:
        parser.error("--preempt-max-times is a count: give 0 or more")
    if not Path(args.trace).is_file():
        parser.error(f"--trace {args.trace} is not a file; give the path of a trace CSV")
    policies = POLICIES if args.policy == "all" else (args.policy,)
    results = []
    for name in policies:
        try:
            result = simulate(
                args.trace,
                name,
                gpus=args.gpus,
                gpus_per_node=args.gpus_per_node,
                users=args.users,
                seed=args.seed,
                load=args.load,
                window=args.window,
                max_jobs=args.max_jobs,
                slot_gpus=args.slot_gpus,
                slots_per_gpu=args.slots_per_gpu,
                timeslot_s=args.timeslot_hours * 3600.0,
                preempt_starving_after_s=_seconds(args.preempt_starving_hours, 3600.0),
                preempt_share_after_s=_seconds(args.preempt_share_minutes, 60.0),
                preempt_max_times=args.preempt_max_times,
            )
        except EmptyWorkload as exc:
            print(f"simulate: {exc}", file=sys.stderr)
            return 2
        results.append(result)
        if args.json:
            print(json.dumps(result), flush=True)
    if not args.json:
        print(format_table(results))
    return 0

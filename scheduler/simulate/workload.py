"""The trace read into jobs: users, time limits, queues and the share tree
(how, and why, in ``scheduler.simulate``'s docstring and docs/scheduler.md)."""

from __future__ import annotations

import bisect
import csv
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduler.model import ShareNode
from scheduler.predict import JobFeatures

DENSE_START_S = 9_900_000.0
STANDARD_LIMITS_S = (
    600.0,
    1800.0,
    3600.0,
    2 * 3600.0,
    4 * 3600.0,
    8 * 3600.0,
    12 * 3600.0,
    24 * 3600.0,
    48 * 3600.0,
    72 * 3600.0,
    7 * 86_400.0,
)
CATEGORY_WEIGHTS = {"staff": 1.0, "phd": 1.0, "master": 0.5}


@dataclass(slots=True)
class SimJob:
    """One trace job and what happened to it in the simulation."""

    index: int
    user: str
    category: str
    queue: str
    gpus: int
    shared_slot: bool
    submit: float
    duration: float
    time_limit: float
    preemptible: bool
    features: JobFeatures
    predicted: float = 0.0
    eta: float | None = None
    gpu_model: str | None = None
    start: float | None = None
    end: float | None = None
    gpu_ids: tuple[str, ...] = ()
    # Where a preempted job ran: (start, end) of each stretch; empty: start to end.
    runs: tuple[tuple[float, float], ...] = ()


@dataclass(slots=True)
class Workload:
    jobs: list[SimJob]
    users: list[str]
    entitlement: dict[str, float]
    share_tree: ShareNode
    categories: dict[str, str] = field(default_factory=dict)
    # "trace" when the trace names its users, "synthesised" when the simulator drew them.
    users_source: str = "synthesised"
    # Jobs wider than any node: refused at load, as the portal refuses them at submit.
    refused: int = 0
    window: str = "all"
    # Fractional-GPU jobs whose limit is over the debug queue's hour: replayed as whole-GPU
    # normal jobs (the portal's shared slots are the debug queue's only), and counted.
    fractional_as_whole: int = 0


class EmptyWorkload(ValueError):
    """The trace, or the window asked for, holds no job to replay."""


NO_USER = {"", "NA", "na", "None", "-"}


def auto_window_start(submits: Sequence[float]) -> float:
    """Where the dense part of a trace begins: past a sparse head (at most 1% of the jobs
    spread over more than half of the trace's span), or at its first job."""
    if len(submits) < 2:
        return submits[0] if submits else 0.0
    ordered = sorted(submits)
    span = ordered[-1] - ordered[0]
    # The head ends at the widest gap among the cuts that leave at most 1% behind.
    cuts = [k for k in range(1, len(ordered) // 100 + 1) if ordered[k] - ordered[0] > 0.5 * span]
    if not cuts:
        return ordered[0]
    k = max(cuts, key=lambda k: (ordered[k] - ordered[k - 1], k))
    return ordered[k]


def round_up_to_standard_limit(seconds: float) -> float:
    """The smallest standard limit that is at least ``seconds`` (whole days past 7 d)."""
    i = bisect.bisect_left(STANDARD_LIMITS_S, seconds)
    if i < len(STANDARD_LIMITS_S):
        return STANDARD_LIMITS_S[i]
    return math.ceil(seconds / 86_400.0) * 86_400.0


def category_of_rank(rank: int) -> str:
    if rank % 5 == 0:
        return "staff"
    if rank % 5 in (1, 2):
        return "phd"
    return "master"


def load_workload(
    path: str,
    *,
    users: int,
    seed: int,
    load: float,
    window: str,
    max_jobs: int | None,
    max_gpus_per_job: int | None = None,
) -> Workload:
    """Read the trace and turn its rows into jobs with users, limits and queues.

    Raises ``EmptyWorkload`` when nothing is left to replay. Jobs wider than
    ``max_gpus_per_job`` (the widest node) are refused and counted.
    """
    rows: list[dict[str, str]] = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            if not row["duration_s"] or not row["start_time_s"]:
                continue  # never scheduled in production: no run time to replay
            rows.append(row)
    if not rows:
        raise EmptyWorkload(f"{path} holds no job with a run time to replay")
    lo, hi = -math.inf, math.inf
    if window == "auto":
        lo = auto_window_start([float(r["submit_time_s"]) for r in rows])
    elif window == "dense":
        lo = DENSE_START_S
    elif window != "all":
        first, _, last = window.partition(":")
        try:
            lo = float(first) if first else -math.inf
            hi = float(last) if last else math.inf
        except ValueError:
            raise EmptyWorkload(
                f"--window {window!r} is not auto, dense, all or START:END in trace seconds"
            ) from None
    kept = [r for r in rows if lo <= float(r["submit_time_s"]) < hi]
    if not kept:
        submits = [float(r["submit_time_s"]) for r in rows]
        raise EmptyWorkload(
            f"--window {window} keeps none of the {len(rows)} jobs, which were submitted "
            f"between {min(submits):.0f} s and {max(submits):.0f} s; choose a window in "
            "that range, or --window all"
        )
    rows = kept
    rows.sort(key=lambda r: (float(r["submit_time_s"]), r["job_id"]))
    refused = 0
    if max_gpus_per_job is not None:
        fits = [r for r in rows if int(r["num_gpus"]) <= max_gpus_per_job]
        refused = len(rows) - len(fits)
        rows = fits
    if max_jobs is not None:
        rows = rows[:max_jobs]
    if not rows:
        raise EmptyWorkload(f"every job in the window is wider than {max_gpus_per_job} GPUs")

    rng = random.Random(seed)
    trace_users = [r["user"] for r in rows if r.get("user", "").strip() not in NO_USER]
    if len(trace_users) == len(rows):
        # The trace's own users, ranked by how many jobs they submitted (ties by name).
        counts: dict[str, int] = {}
        for name in trace_users:
            counts[name] = counts.get(name, 0) + 1
        names = sorted(counts, key=lambda n: (-counts[n], n))
        users_source = "trace"
    else:
        names = [f"user{r:02d}" for r in range(users)]
        users_source = "synthesised"
    weights = [1.0 / (r + 1) ** 1.1 for r in range(len(names))]
    categories = {name: category_of_rank(r) for r, name in enumerate(names)}
    t0 = float(rows[0]["submit_time_s"])
    jobs: list[SimJob] = []
    fractional_as_whole = 0
    for i, row in enumerate(rows):
        user = row["user"] if users_source == "trace" else rng.choices(names, weights)[0]
        duration = max(1.0, float(row["duration_s"]))
        factor = 1.2 + rng.expovariate(1 / 1.3)
        limit = round_up_to_standard_limit(duration * factor)
        gpus = int(row["num_gpus"])
        frac = float(row["gpu_frac"])
        debug = gpus == 1 and frac < 1.0 and limit <= 3600.0
        fractional_as_whole += gpus == 1 and frac < 1.0 and not debug
        submit = t0 + (float(row["submit_time_s"]) - t0) / load
        jobs.append(
            SimJob(
                index=i,
                user=user,
                category=categories[user],
                queue="debug" if debug else "normal",
                gpus=gpus,
                shared_slot=debug,
                submit=submit,
                duration=duration,
                time_limit=limit,
                preemptible=row["queue"] == "BE",
                features=JobFeatures(user, f"{row['queue']}-{frac:.2f}", "run", gpus),
            )
        )

    by_category: dict[str, list[str]] = {}
    for name in names:
        by_category.setdefault(categories[name], []).append(name)
    tree = ShareNode(
        "lab",
        1.0,
        tuple(
            ShareNode(
                cat, CATEGORY_WEIGHTS[cat] * len(members), tuple(ShareNode(u, 1.0) for u in members)
            )
            for cat, members in sorted(by_category.items())
        ),
    )
    total_weight = sum(CATEGORY_WEIGHTS[categories[n]] for n in names)
    entitlement = {n: CATEGORY_WEIGHTS[categories[n]] / total_weight for n in names}
    return Workload(
        jobs,
        names,
        entitlement,
        tree,
        categories,
        users_source=users_source,
        refused=refused,
        window=window if window != "auto" else f"auto (from {lo:.0f} s)",
        fractional_as_whole=fractional_as_whole,
    )


def _unit_gpus(job: SimJob, slots_per_gpu: int) -> float:
    return 1.0 / slots_per_gpu if job.shared_slot else float(job.gpus)

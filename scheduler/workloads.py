"""Seeded, lab-like GPU workloads for the simulator, in the trace CSV format.

``python -m scheduler.workloads --profile wide --seed 3 --out /tmp/wide.csv``

A real lab's mix is not the development trace's (99% one-GPU pods). The
generator draws:

* **Widths** from a chosen share of 1, 2, 4 and 8 GPUs (``--mix 1:0.5,2:0.2,...``).
* **Run times** heavy-tailed: a log-normal body (median ``--median-runtime-s``)
  with a Pareto tail for a share of jobs, capped at two weeks; wide jobs run
  longer on average (training runs), one-GPU jobs include many short trials.
* **Arrivals** as a non-homogeneous Poisson process: a diurnal curve (quiet at
  night, peaks late morning and evening), quieter weekends, and deadline bursts
  (a few days before a conference deadline, arrivals triple).
* **Users** with skewed demand: a Zipf draw over ``--users`` users; heavy users
  also submit wider jobs more often.

The rows have a real ``user`` column, so the simulator uses these users rather
than synthesising its own. Every draw comes from one ``random.Random(seed)``: the
same arguments always write the same file.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass

HOUR = 3600.0
DAY = 86_400.0
MAX_RUNTIME_S = 14 * DAY


@dataclass(frozen=True)
class Profile:
    """The knobs of one family of workloads."""

    name: str
    mix: dict[int, float]
    jobs_per_day: float
    days: float
    median_runtime_s: float
    tail_share: float  # share of jobs drawn from the Pareto tail
    users: int
    debug_share: float  # short one-GPU jobs on a fraction of a GPU
    deadline_days: tuple[float, ...] = ()


PROFILES: dict[str, Profile] = {
    # A lab of students: mostly one-GPU jobs, some sweeps of 2; a deadline in week 3.
    "lab": Profile(
        "lab", {1: 0.7, 2: 0.15, 4: 0.1, 8: 0.05}, 120, 28, 1.5 * HOUR, 0.1, 25, 0.15, (18.0,)
    ),
    # Training-heavy: half the jobs are 4 or 8 GPUs wide, as in the held-out probe.
    "wide": Profile(
        "wide", {1: 0.3, 2: 0.2, 4: 0.25, 8: 0.25}, 40, 28, 3 * HOUR, 0.15, 20, 0.05, (10.0, 24.0)
    ),
    # Only wide jobs, long and heavy-tailed: the hardest case for backfill.
    "wide-only": Profile("wide-only", {4: 0.5, 8: 0.5}, 14, 35, 6 * HOUR, 0.2, 16, 0.0, (20.0,)),
    # Many short trials with bursts: a course or a hackathon.
    "bursty": Profile(
        "bursty", {1: 0.85, 2: 0.1, 4: 0.05}, 300, 14, 20 * 60.0, 0.05, 40, 0.3, (4.0, 9.0)
    ),
}


def _rate_factor(t: float, deadlines: Sequence[float]) -> float:
    """Relative arrival rate at ``t`` seconds from Monday 00:00 (mean about 1)."""
    hour = (t % DAY) / HOUR
    # Two humps (11:00 and 21:00) over a night floor.
    diurnal = (
        0.25
        + 0.9 * math.exp(-(((hour - 11) / 3.0) ** 2))
        + 0.7 * math.exp(-(((hour - 21) / 2.5) ** 2))
    )
    weekday = int(t // DAY) % 7
    weekly = 0.45 if weekday >= 5 else 1.0
    burst = 1.0
    for d in deadlines:
        before = d * DAY - t
        if 0 <= before <= 4 * DAY:
            burst = max(burst, 3.0 - before / (2 * DAY))
    return diurnal * weekly * burst / 0.62


def _runtime(rng: random.Random, profile: Profile, gpus: int) -> float:
    wide_factor = 1.0 + 0.35 * math.log2(gpus)
    if rng.random() < profile.tail_share:
        # Pareto tail (alpha 1.3) from 4× the median: a few jobs run for days.
        value = 4 * profile.median_runtime_s * wide_factor * rng.paretovariate(1.3)
    else:
        value = rng.lognormvariate(math.log(profile.median_runtime_s * wide_factor), 1.1)
    return float(min(MAX_RUNTIME_S, max(30.0, value)))


def generate(profile: Profile, seed: int) -> list[dict[str, object]]:
    """The rows of one workload, sorted by submit time."""
    rng = random.Random(seed)
    users = [f"u{r:02d}" for r in range(profile.users)]
    user_weights = [1.0 / (r + 1) ** 1.2 for r in range(profile.users)]
    widths = sorted(profile.mix)
    rows: list[dict[str, object]] = []
    peak = max(_rate_factor(h * HOUR, profile.deadline_days) for h in range(int(profile.days * 24)))
    mean_gap = DAY / profile.jobs_per_day
    t = 0.0
    end = profile.days * DAY
    while True:
        # Thinning: candidates at the peak rate, kept with probability rate/peak.
        t += rng.expovariate(peak / mean_gap)
        if t >= end:
            break
        if rng.random() > _rate_factor(t, profile.deadline_days) / peak:
            continue
        rank = rng.choices(range(profile.users), user_weights)[0]
        user = users[rank]
        if rng.random() < profile.debug_share:
            gpus, frac, runtime = 1, 0.25, float(rng.uniform(60, 1500))
        else:
            # Heavy users lean wider: their mix is tilted towards the wide end.
            tilt = 1.0 + (0.6 if rank < 3 else 0.0)
            weights = [profile.mix[w] * (tilt if w >= 4 else 1.0) for w in widths]
            gpus = rng.choices(widths, weights)[0]
            frac, runtime = 1.0, _runtime(rng, profile, gpus)
        rows.append(
            {
                "job_id": f"{profile.name}-{len(rows):06d}",
                "user": user,
                "submit_time_s": round(t),
                "start_time_s": round(t),
                "duration_s": round(runtime),
                "num_gpus": gpus,
                "gpu_frac": frac,
                "queue": "BE" if rng.random() < 0.1 else "LS",
                "status": "Succeeded",
                "wait_s": 0,
            }
        )
    return rows


FIELDS = [
    "job_id",
    "user",
    "submit_time_s",
    "start_time_s",
    "duration_s",
    "num_gpus",
    "gpu_frac",
    "queue",
    "status",
    "wait_s",
]


def write(rows: list[dict[str, object]], path: str) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduler.workloads", description=__doc__)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="wide")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--days", type=float, default=None, help="override the profile's length")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    profile = PROFILES[args.profile]
    if args.days is not None:
        profile = Profile(**{**profile.__dict__, "days": args.days})
    rows = generate(profile, args.seed)
    write(rows, args.out)
    print(f"wrote {len(rows)} jobs ({profile.name}, seed {args.seed}) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

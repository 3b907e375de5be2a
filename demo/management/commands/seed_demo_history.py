"""Give the demo lab twelve weeks of simulated history, so the reports have something to show.

The history is made up (named as such in every job's name): finished jobs whose load
grows from about 30% to about 65% of the GPUs, and a few bookings, some of them no-shows.
Its telemetry is written as the hourly rollups that the agents' samples (one every
`SAMPLE_INTERVAL_S` per GPU) would have rolled up into, so every figure agrees: held
minutes are the minutes a job held the GPU, idle GPUs report 0%, and a node whose agent
was down for a while (`AGENT_DOWN`) has no readings then, which the report counts as
uncovered time. The history belongs to its own past weeks: it is not charged (each job
has its efficiency verdict, so the settle sweep leaves it alone; bookings are checked
and charged nothing) and sends no notifications. Run after `seed_demo`; running it again
adds nothing. It then fits the demand forecast, so the demo's report page shows one
from the start.
"""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter, defaultdict
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone

from accounts.models import CreditPolicy, JobEfficiency, User
from cluster.models import Gpu
from jobqueue.models import Allocation, ContainerImage, Job, Queue
from reports.models import LabProfile
from reports.services import forecast_refresh
from reservations.models import Reservation
from telemetry.models import GpuHourRollup, RollupCursor

NAME_PREFIX = "simulated history"
WEEKS = 12
SHAPES = ((1, 0.55), (2, 0.3), (4, 0.15))  # (GPUs, share of jobs)
SAMPLE_INTERVAL_S = 5  # the agent's default sampling interval
SAMPLES_PER_MINUTE = 60 // SAMPLE_INTERVAL_S
# (node index, week, first hour of that week, hours): the agent sent nothing then.
AGENT_DOWN = ((1, 4, 50, 30),)


class Command(BaseCommand):
    help = "Add twelve weeks of simulated job, telemetry and booking history to the demo lab."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--weeks", type=int, default=WEEKS)
        parser.add_argument("--seed", type=int, default=1)

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        if Job.objects.filter(name__startswith=NAME_PREFIX).exists():
            self.stdout.write("The demo history is already there.")
            forecast_refresh()  # a no-op unless the data changed since the last fit
            return
        gpus = list(
            Gpu.objects.filter(kind=Gpu.Kind.WHOLE)
            .select_related("node")
            .order_by("node__name", "index")
        )
        users = list(User.objects.filter(is_staff=False, is_active=True).order_by("username"))
        image = ContainerImage.objects.order_by("id").first()
        if not gpus or not users or image is None:
            self.stderr.write("Run seed_demo first: the history needs GPUs, members and an image.")
            return
        made = _history(
            gpus, users, image, weeks=options["weeks"], rng=random.Random(options["seed"])
        )
        self.stdout.write(self.style.SUCCESS(f"Added {made} simulated jobs of history."))
        _lab_profile(weeks=options["weeks"])
        # Fitted now, so the demo's first report page shows it (later: the control worker).
        forecast_refresh()


def _lab_profile(*, weeks: int) -> None:
    """The demo lab's name, and its rules in force from the history's middle week, so the
    report compares the weeks before them with the weeks after (the history's allocation
    rises from 30 % to 65 %, as the lab's in the article did)."""
    profile = LabProfile.current()
    if profile.pk is None:
        profile.name = "Demo lab (simulated history)"
        profile.name_zh_hans = "演示实验室（模拟的历史）"
        profile.rules_since = timezone.localdate() - dt.timedelta(weeks=weeks // 2)
        profile.save()


@dataclass
class _Run:
    """One history job's run on one GPU, in whole minutes from the history's start."""

    job: Job
    first: int
    last: int  # exclusive
    util: float  # the job's mean utilisation, 0..1


def _history(
    gpus: list[Gpu], users: list[User], image: ContainerImage, *, weeks: int, rng: random.Random
) -> int:
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    start = now - dt.timedelta(weeks=weeks)
    normal, debug = Queue.objects.get(name="normal"), Queue.objects.get(name="debug")
    by_node: dict[str, list[Gpu]] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node.name, []).append(gpu)
    # Minutes from `start`: whole minutes, as the rollups count them.
    free_at = {gpu.pk: 0 for gpu in gpus}
    end_min = weeks * 7 * 24 * 60
    capacity_h = len(gpus) * 168
    jobs: list[tuple[Job, list[Gpu], float]] = []
    for week in range(weeks):
        # The article's lab: from about 30% of the GPUs allocated to about 65%.
        target = capacity_h * (0.30 + 0.35 * week / max(1, weeks - 1))
        week_first = week * 7 * 24 * 60
        asked = 0.0
        wanted: list[tuple[int, int, int]] = []
        while asked < target:
            size = rng.choices([s for s, _ in SHAPES], [w for _, w in SHAPES])[0]
            short = size == 1 and rng.random() < 0.25
            minutes = round(60 * (rng.uniform(0.2, 0.9) if short else rng.uniform(1, 20)))
            wanted.append((week_first + rng.randrange(7 * 24 * 60), size, minutes))
            asked += size * minutes / 60
        for submitted, size, minutes in sorted(wanted):
            node = min(by_node, key=lambda n: sorted(free_at[g.pk] for g in by_node[n])[size - 1])
            chosen = sorted(by_node[node], key=lambda g: free_at[g.pk])[:size]
            started = max([submitted, *(free_at[g.pk] for g in chosen)])
            ended = started + minutes
            if ended > end_min:
                break
            for gpu in chosen:
                free_at[gpu.pk] = ended
            state = rng.choices(["completed", "failed", "cancelled"], [0.85, 0.1, 0.05])[0]
            small = size == 1 and minutes < 60
            at = start + dt.timedelta(minutes=started)
            job = Job(
                owner=rng.choice(users),
                queue=debug if small else normal,
                name=f"{NAME_PREFIX} {len(jobs) + 1}",
                image=image,
                command=["python", "train.py", f"--seed={len(jobs)}"],
                gpus=size,
                time_limit_s=3600 if small else 24 * 3600,
                state=state,
                node=chosen[0].node,
                submitted_at=start + dt.timedelta(minutes=submitted),
                dispatched_at=at,
                started_at=at,
                ended_at=start + dt.timedelta(minutes=ended),
                exit_code=0 if state == "completed" else 1,
            )
            # Better habits over the weeks: real utilisation rises with the allocation.
            jobs.append((job, chosen, min(0.98, rng.uniform(0.35, 0.75) + 0.2 * week / weeks)))
    Job.objects.bulk_create([job for job, _gpus, _util in jobs], batch_size=500)
    allocations = []
    runs: dict[int, list[_Run]] = defaultdict(list)
    for job, chosen, util in jobs:
        assert job.started_at is not None and job.ended_at is not None
        first = int((job.started_at - start).total_seconds()) // 60
        last = int((job.ended_at - start).total_seconds()) // 60
        for gpu in chosen:
            allocations.append(
                Allocation(
                    job=job,
                    gpu=gpu,
                    active=False,
                    allocated_at=job.started_at,
                    released_at=job.ended_at,
                )
            )
            runs[gpu.pk].append(_Run(job, first, last, util))
    Allocation.objects.bulk_create(allocations, batch_size=1000)
    down = _agent_down_hours(gpus, weeks)
    GpuHourRollup.objects.bulk_create(
        _hour_rollups(gpus, runs, start, weeks * 7 * 24, down, rng), batch_size=2000
    )
    JobEfficiency.objects.bulk_create(_efficiencies(jobs, runs, down), batch_size=1000)
    # The rollups reach the history's end: the report reads it from them, and the live
    # rollups start from there.
    for level in RollupCursor.Level.values:
        cursor, _created = RollupCursor.objects.get_or_create(level=level)
        if cursor.done_until is None:
            RollupCursor.objects.filter(pk=cursor.pk).update(done_until=now)
    _bookings(gpus, users, start, weeks)
    return len(jobs)


def _agent_down_hours(gpus: list[Gpu], weeks: int) -> set[tuple[int, int]]:
    """(GPU id, hour from the history's start) pairs without readings."""
    nodes = sorted({gpu.node_id for gpu in gpus})
    down: set[tuple[int, int]] = set()
    for node_index, week, first_hour, hours in AGENT_DOWN:
        if node_index >= len(nodes) or week >= weeks:
            continue
        for gpu in gpus:
            if gpu.node_id == nodes[node_index]:
                base = week * 168 + first_hour
                down.update((gpu.pk, hour) for hour in range(base, base + hours))
    return down


def _hour_rollups(
    gpus: list[Gpu],
    runs: dict[int, list[_Run]],
    start: dt.datetime,
    hours: int,
    down: set[tuple[int, int]],
    rng: random.Random,
) -> list[GpuHourRollup]:
    """Every GPU-hour of the history as the hour rollup would compute it from its minutes:
    each held minute at its job's utilisation, each free minute at 0%."""
    rows = []
    for gpu in gpus:
        held: dict[int, list[tuple[_Run, int]]] = defaultdict(list)  # hour → (run, minutes)
        for run in runs[gpu.pk]:
            for hour in range(run.first // 60, (run.last - 1) // 60 + 1):
                minutes = min(run.last, 60 * hour + 60) - max(run.first, 60 * hour)
                if minutes > 0:
                    held[hour].append((run, minutes))
        for hour in range(hours):
            if (gpu.pk, hour) in down:
                continue
            parts = held.get(hour, [])
            busy = sum(m for _run, m in parts)
            levels = [(max(0.0, min(100.0, rng.gauss(100 * run.util, 5))), m) for run, m in parts]
            per_job = Counter({run.job.pk: m for run, m in parts})
            top = min(per_job, key=lambda j: (-per_job[j], j)) if per_job else None
            top_run = next((run for run, _m in parts if run.job.pk == top), None)
            rows.append(
                GpuHourRollup(
                    gpu=gpu,
                    bucket=start + dt.timedelta(hours=hour),
                    samples=60 * SAMPLES_PER_MINUTE,
                    util_mean=sum(level * m for level, m in levels) / 60,
                    util_max=max((level for level, _m in levels), default=0.0),
                    mem_used_max_mb=20000 if parts else 0,
                    temp_max_c=70.0 if parts else 35.0,
                    power_mean_w=250.0 * busy / 60 + 60.0,
                    job_id=top,
                    user_id=top_run.job.owner_id if top_run is not None else None,
                    minutes=60,
                    busy_minutes=busy,
                    held_minutes=per_job[top] if top is not None else 0,
                )
            )
    return rows


def _efficiencies(
    jobs: list[tuple[Job, list[Gpu], float]],
    runs: dict[int, list[_Run]],
    down: set[tuple[int, int]],
) -> list[JobEfficiency]:
    """Each history job's verdict, as a settle would write it, so none is settled (charged) now."""
    policy = CreditPolicy.current()
    covered: Counter[int] = Counter()
    for gpu_id, gpu_runs in runs.items():
        for run in gpu_runs:
            covered[run.job.pk] += sum(
                1 for minute in range(run.first, run.last) if (gpu_id, minute // 60) not in down
            )
    verdicts = []
    for job, _chosen, util in jobs:
        samples = covered[job.pk] * SAMPLES_PER_MINUTE
        mean = 100 * util if samples else None
        if mean is None:
            verdict = JobEfficiency.Verdict.UNKNOWN
        elif mean >= policy.efficiency_threshold_pct:
            verdict = JobEfficiency.Verdict.REWARDED
        elif mean < policy.idle_threshold_pct:
            verdict = JobEfficiency.Verdict.IDLE
        else:
            verdict = JobEfficiency.Verdict.ORDINARY
        verdicts.append(
            JobEfficiency(job=job, mean_util_pct=mean, sample_count=samples, verdict=verdict)
        )
    return verdicts


def _bookings(gpus: list[Gpu], users: list[User], start: dt.datetime, weeks: int) -> None:
    """A weekly booking per member; every fourth one a no-show. Checked and uncharged."""
    for week in range(weeks):
        for i, user in enumerate(users):
            begin = start + dt.timedelta(weeks=week, days=i + 1, hours=9)
            end = begin + dt.timedelta(hours=4)
            if end > timezone.now():
                continue
            reservation = Reservation.objects.create(
                user=user,
                start=begin,
                end=end,
                state=Reservation.State.COMPLETED,
                note=f"{NAME_PREFIX}",
                no_show=(week + i) % 4 == 0,
                no_show_checked_at=begin,
                charged=Decimal(0),
            )
            reservation.gpus.set([gpus[-1 - i % len(gpus)]])

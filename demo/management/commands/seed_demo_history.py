"""Give the demo lab twelve weeks of simulated history, so the reports have something to show.

The history is made up (named as such in every job's name): finished jobs whose load
grows from about 30% to about 65% of the GPUs, hourly telemetry with the jobs' own
utilisation, and a few bookings, some of them no-shows. Run after `seed_demo`;
running it again adds nothing. It then fits the demand forecast, so the demo's report page
shows one from the start.
"""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone

from accounts.models import User
from cluster.models import Gpu
from jobqueue.models import Allocation, ContainerImage, Job, Queue
from reports.services import forecast_refresh
from reservations.models import Reservation
from telemetry.models import GpuSample

NAME_PREFIX = "simulated history"
WEEKS = 12
SHAPES = ((1, 0.55), (2, 0.3), (4, 0.15))  # (GPUs, share of jobs)


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
        # Fitted now, so the demo's first report page shows it (later: the control worker).
        forecast_refresh()


def _history(
    gpus: list[Gpu], users: list[User], image: ContainerImage, *, weeks: int, rng: random.Random
) -> int:
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    start = now - dt.timedelta(weeks=weeks)
    normal, debug = Queue.objects.get(name="normal"), Queue.objects.get(name="debug")
    by_node: dict[str, list[Gpu]] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node.name, []).append(gpu)
    free_at = {gpu.pk: start for gpu in gpus}
    capacity_h = len(gpus) * 168
    jobs: list[tuple[Job, list[Gpu], float]] = []
    for week in range(weeks):
        # The article's lab: from about 30% of the GPUs allocated to about 65%.
        target = capacity_h * (0.30 + 0.35 * week / max(1, weeks - 1))
        week_start = start + dt.timedelta(weeks=week)
        asked = 0.0
        wanted: list[tuple[dt.datetime, int, float]] = []
        while asked < target:
            size = rng.choices([s for s, _ in SHAPES], [w for _, w in SHAPES])[0]
            short = size == 1 and rng.random() < 0.25
            hours = rng.uniform(0.2, 0.9) if short else rng.uniform(1, 20)
            wanted.append((week_start + dt.timedelta(hours=rng.uniform(0, 168)), size, hours))
            asked += size * hours
        for submitted, size, hours in sorted(wanted):
            node = min(by_node, key=lambda n: sorted(free_at[g.pk] for g in by_node[n])[size - 1])
            chosen = sorted(by_node[node], key=lambda g: free_at[g.pk])[:size]
            started = max([submitted, *(free_at[g.pk] for g in chosen)])
            ended = started + dt.timedelta(hours=hours)
            if ended > now:
                break
            for gpu in chosen:
                free_at[gpu.pk] = ended
            state = rng.choices(["completed", "failed", "cancelled"], [0.85, 0.1, 0.05])[0]
            small = size == 1 and hours < 1
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
                submitted_at=submitted,
                dispatched_at=started,
                started_at=started,
                ended_at=ended,
                exit_code=0 if state == "completed" else 1,
            )
            # Better habits over the weeks: real utilisation rises with the allocation.
            jobs.append((job, chosen, min(0.98, rng.uniform(0.35, 0.75) + 0.2 * week / weeks)))
    Job.objects.bulk_create([job for job, _gpus, _util in jobs], batch_size=500)
    allocations, samples = [], []
    for job, chosen, util in jobs:
        assert job.started_at is not None and job.ended_at is not None
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
            ts = job.started_at + dt.timedelta(minutes=rng.randint(0, 59))
            while ts < job.ended_at:
                level = max(0.0, min(100.0, rng.gauss(100 * util, 10)))
                samples.append(
                    GpuSample(gpu=gpu, ts=ts, util_pct=level, job_id=job.pk, mem_used_mb=20000)
                )
                ts += dt.timedelta(hours=1)
    Allocation.objects.bulk_create(allocations, batch_size=1000)
    GpuSample.objects.bulk_create(samples, batch_size=2000, ignore_conflicts=True)
    for week in range(weeks):
        for i, user in enumerate(users):
            begin = start + dt.timedelta(weeks=week, days=i + 1, hours=9)
            reservation = Reservation.objects.create(
                user=user,
                start=begin,
                end=begin + dt.timedelta(hours=4),
                state=Reservation.State.COMPLETED,
                note=f"{NAME_PREFIX}",
                no_show=(week + i) % 4 == 0,
            )
            reservation.gpus.set([gpus[-1 - i % len(gpus)]])
    return len(jobs)

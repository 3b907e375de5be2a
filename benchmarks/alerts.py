"""Benchmark: one evaluation of every alert rule over 1,024 GPUs and 2,000 running jobs.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/labportal python -m benchmarks.alerts --json

It creates (and afterwards drops) a database `<name>_alertsbench` next to the one
in DATABASE_URL and fills it like a department: 1,024 GPUs on 128 nodes, 600 jobs on
whole GPUs and 1,400 on 4-way shared slots, and raw samples every 5 s for the idle
window (30 minutes: 368,640 rows), with some idle jobs, leaks, strays and a hot GPU.
Figures, all from this run:

- baseline: the idle rule's 30-minute utilisation read from the raw samples (what
  the rules read before the minute rollups; they now read the rollups for it);
- first evaluation: the rules fire their alerts (and warn owners and staff);
- steady evaluation: the same conditions again (deduplicated), median of 5.

The goal is a steady evaluation under 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from datetime import timedelta
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--sample-interval", type=int, default=5, help="seconds between samples")
    parser.add_argument("--window-min", type=int, default=30, help="minutes of samples stored")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--profile", action="store_true", help="print where a steady run spends")
    parser.add_argument("--keep", action="store_true", help="keep the database (for --reuse)")
    parser.add_argument("--reuse", action="store_true", help="measure the kept database again")
    args = parser.parse_args(argv)

    from benchmarks.portal import (
        bench_database_url,
        production_settings_environment,
        recreate_database,
    )

    source = os.environ.get("DATABASE_URL", "")
    if not source.startswith("postgres"):
        print("benchmarks.alerts needs PostgreSQL: set DATABASE_URL=postgres://…", file=sys.stderr)
        return 2
    bench_url, admin_url, name = bench_database_url(source, "alertsbench")
    if not args.reuse:
        recreate_database(admin_url, name)
    production_settings_environment(
        "alertsbench", DATABASE_URL=bench_url, CELERY_TASK_ALWAYS_EAGER="false"
    )
    import django

    django.setup()
    from django.core import mail
    from django.core.management import call_command
    from django.db import connection

    try:
        mail.outbox = []
        _no_broker()
        if args.reuse:
            from cluster.models import Gpu
            from jobqueue.models import Job
            from telemetry.models import GpuSample

            seeded = {
                "gpus": Gpu.objects.exclude(kind=Gpu.Kind.SLOT).count(),
                "jobs": Job.objects.filter(state=Job.State.RUNNING).count(),
                "samples": GpuSample.objects.count(),
            }
        else:
            call_command("migrate", verbosity=0)
            seeded = _seed(args)
        results = _measure(args, now=seeded.pop("now", None))
        results.update(seeded)
    finally:
        connection.close()
        if not args.keep:
            recreate_database(admin_url, name, drop_only=True)

    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"alert evaluation over {results['gpus']} GPUs and {results['jobs']} running jobs")
        print(f"  samples in the window          {results['samples']:>10,}")
        print(f"  baseline: window aggregate     {results['baseline_ms']:>10.0f} ms")
        print(f"  first evaluation (fires)      {results['first_ms']:>10.0f} ms")
        print(f"  steady evaluation, median of 5 {results['steady_ms']:>10.0f} ms")
        print(f"  alerts open                    {results['open_alerts']:>10}")
        print(
            f"  goal: steady under 1000 ms -> {'met' if results['steady_ms'] < 1000 else 'NOT met'}"
        )
    return 0


def _no_broker() -> None:
    """The clean-up messages to agents go nowhere: there are no agents in a benchmark."""
    from core.portal_app import portal_app

    app = portal_app()

    app.send_task = lambda *a, **k: None


def _seed(args: argparse.Namespace) -> dict[str, Any]:
    from django.conf import settings
    from django.utils import timezone

    from accounts.models import User
    from cluster.models import Gpu, Node
    from cluster.services import gpu_set_shared_slots
    from jobqueue.models import Allocation, ContainerImage, Job, Queue
    from telemetry.models import GpuSample

    rng = random.Random(11)
    now = timezone.now().replace(microsecond=0)
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    users = [
        User.objects.create_user(username=f"member{i:03d}", email=f"m{i}@lab.example")
        for i in range(200)
    ]
    User.objects.create_user(username="admin", email="admin@lab.example", is_staff=True)
    image = ContainerImage.objects.create(reference="lab/train:1")
    normal, debug = Queue.objects.get(name="normal"), Queue.objects.get(name="debug")
    nodes = Node.objects.bulk_create(
        Node(name=f"n{i:03d}", state=Node.State.UP, registered_at=now, last_heartbeat=now)
        for i in range(args.gpus // 8)
    )
    gpus = Gpu.objects.bulk_create(
        Gpu(
            node=nodes[i // 8],
            index=i % 8,
            uuid=f"GPU-bench-{i:05d}",
            model="A100",
            memory_mb=81920,
            sampled_at=now,
        )
        for i in range(args.gpus)
    )
    whole_jobs = args.jobs * 3 // 10
    slot_gpus = (args.jobs - whole_jobs + 3) // 4
    for gpu in gpus[whole_jobs : whole_jobs + slot_gpus]:
        gpu_set_shared_slots(gpu_id=gpu.pk, slots=4)
    slots = list(Gpu.objects.filter(kind=Gpu.Kind.SLOT).order_by("pk"))
    units = [(g, normal) for g in gpus[:whole_jobs]] + [
        (s, debug) for s in slots[: args.jobs - whole_jobs]
    ]
    started = now - timedelta(hours=2)
    jobs = Job.objects.bulk_create(
        Job(
            owner=rng.choice(users),
            queue=queue,
            image=image,
            command=["python", "train.py"],
            time_limit_s=86400,
            state=Job.State.RUNNING,
            started_at=started,
            node_id=unit.node_id,
            shared_slot=unit.kind == Gpu.Kind.SLOT,
        )
        for unit, queue in units
    )
    Allocation.objects.bulk_create(
        Allocation(job=job, gpu=unit, allocated_at=started)
        for job, (unit, _q) in zip(jobs, units, strict=True)
    )
    job_on: dict[int, list[Job]] = {}
    for job, (unit, _q) in zip(jobs, units, strict=True):
        job_on.setdefault(unit.parent_id or unit.pk, []).append(job)

    idle = set(rng.sample(range(whole_jobs), max(1, whole_jobs // 20)))  # 5% idle
    free = gpus[whole_jobs + slot_gpus :]
    leaking = {g.pk for g in free[: max(1, len(free) // 4)]}
    hot = {gpus[1].pk}
    stray = {gpus[2].pk}
    rows: list[Any] = []
    count = 0
    steps = args.window_min * 60 // args.sample_interval
    for position, gpu in enumerate(gpus):
        here = job_on.get(gpu.pk, [])
        util = 1.0 if position in idle else (0.0 if not here else 70.0)
        mem = 30_000 if gpu.pk in leaking else (4 if not here else 40_000)
        processes = [
            {"pid": 100_000 + j.pk, "used_mb": 9_000, "container_id": f"c{j.pk}", "job_id": j.pk}
            for j in here
        ]
        if gpu.pk in stray:
            processes.append(
                {
                    "pid": 4242,
                    "used_mb": 2000,
                    "container_id": None,
                    "job_id": None,
                    "unix_user": "x",
                }
            )
        for step in range(steps + 1):
            rows.append(
                GpuSample(
                    gpu=gpu,
                    ts=now - timedelta(seconds=step * args.sample_interval),
                    util_pct=util,
                    mem_used_mb=mem,
                    mem_total_mb=81920,
                    temp_c=92.0 if gpu.pk in hot else 60.0,
                    ecc_errors=0,
                    xid_errors=0,
                    processes=processes if step == 0 else [],
                )
            )
        if len(rows) >= 20_000:
            GpuSample.objects.bulk_create(rows, batch_size=5_000)
            count += len(rows)
            rows = []
    GpuSample.objects.bulk_create(rows, batch_size=5_000)
    count += len(rows)
    from django.db import connection

    from telemetry.rollups import rollups_run

    while not rollups_run(now=now, budget_s=600).caught_up:  # as the telemetry beat keeps them
        pass
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return {"gpus": len(gpus), "jobs": len(jobs), "samples": count, "now": now}


def _measure(args: argparse.Namespace, now: Any = None) -> dict[str, Any]:
    """Time the evaluation at the moment the seeded samples end (seeding takes minutes)."""
    from django.utils import timezone

    from alerts.models import Alert
    from alerts.readings import _raw_windows
    from alerts.services import alerts_evaluate

    now = now or timezone.now()

    def timed(call: Any) -> float:
        begin = time.perf_counter()
        call()
        return (time.perf_counter() - begin) * 1000

    baseline = statistics.median(
        timed(lambda: _raw_windows({now - timedelta(minutes=args.window_min): ["util"]}))
        for _ in range(3)
    )
    first = timed(lambda: alerts_evaluate(now=now))
    steady = statistics.median(timed(lambda: alerts_evaluate(now=now)) for _ in range(5))
    if args.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.runcall(alerts_evaluate, now=now)
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
    return {
        "baseline_ms": round(baseline, 1),
        "first_ms": round(first, 1),
        "steady_ms": round(steady, 1),
        "open_alerts": Alert.objects.open().count(),
    }


if __name__ == "__main__":
    raise SystemExit(main())

"""Reports benchmarks: the usage report of a year, and a what-if replay of a quarter.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/labportal python -m benchmarks.reports --json

It creates (and afterwards drops) a database `<name>_bench` next to the one in
DATABASE_URL and fills it with a made-up year of a 64-GPU lab (8 nodes of 8 GPUs,
about 100,000 finished jobs scheduled first come first served at an offered load of
about 69%, so no two jobs hold a GPU at once; their hourly telemetry rollups (the rollup cursors at the
end of the year, so the report reads only rollups), one raw sample per GPU-hour of
each job, one credit charge per job). `--keep` keeps that database for the next run
with `--keep`, which then skips the fill. It then measures, in the same run:

- the baseline: one aggregate over all jobs (`COUNT`, `SUM` of GPUs), the least a report must read;
- the usage report of the whole year (every table, as the page builds it): `year_report_s`
  is the selector and the tables alone; `page_*` is the page as a browser gets it (the
  view, its template, then the two charts it links), cold (caches emptied) and warm;
  the demand forecast is fitted by the control worker, so "cold" serves the last fit (of
  an older data version) and `never_fitted` a page with no forecast yet; the fit's own
  cost is `forecast_fit_task_cpu_s` (see `_page_timings`);
- with `--baseline GIT_REF`, the same figures of an older commit on the same database;
- a what-if replay of one quarter (about 25,000 jobs) with the lab's GPUs and with 8 more.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import random
import re
import statistics
import sys
import time
from html import unescape
from pathlib import Path
from typing import Any

from benchmarks.portal import bench_database_url, recreate_database

NODES, PER_NODE = 8, 8
LOAD_SCALE = 0.68  # run times × this: the year's offered load is about 69% of the GPUs
HOUR = dt.timedelta(hours=1)


def _fill(jobs: int, seed: int) -> dt.datetime:
    from decimal import Decimal

    from accounts.models import Category, CreditAccount, LedgerEntry, User
    from cluster.models import Gpu, Node
    from jobqueue.models import Allocation, ContainerImage, Job, Queue
    from telemetry.models import GpuHourRollup, GpuSample, RollupCursor

    rng = random.Random(seed)
    end = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    start = end - dt.timedelta(days=365)
    categories = [
        Category.objects.create(name=n, fairshare_weight=w)
        for n, w in (("PhD", 30), ("Master", 10), ("Staff", 20))
    ]
    users = User.objects.bulk_create(
        [User(username=f"user{i:02d}", category=categories[i % 3]) for i in range(60)]
    )
    accounts = CreditAccount.objects.bulk_create([CreditAccount(user=u) for u in users])
    account_of = {a.user_id: a for a in accounts}
    gpus = []
    for n in range(NODES):
        node_row = Node.objects.create(name=f"node{n:02d}", state=Node.State.UP)
        gpus += [
            Gpu(
                node=node_row,
                index=i,
                uuid=f"GPU-{n}-{i}",
                model="A100" if n < 6 else "L40S",
                memory_mb=81920,
            )
            for i in range(PER_NODE)
        ]
    gpus = Gpu.objects.bulk_create(gpus)
    image = ContainerImage.objects.create(reference="bench/image")
    normal, debug = Queue.objects.get(name="normal"), Queue.objects.get(name="debug")
    span = (end - start).total_seconds()
    # The history is a real schedule, as the portal's would be: every job runs on GPUs of
    # one node that no other job holds at the time, first come first served (no
    # backfill), so its recorded waits come from queueing and a replay with the same
    # GPUs can reproduce them. Run times are scaled so that the year's offered load is
    # about 69% of the 64 GPUs (the unscaled mix would be 101%: a queue that never drains).
    free_at = [[start] * PER_NODE for _ in range(NODES)]  # per node, per GPU
    rows: list[Job] = []
    placed: list[list[int]] = []  # the GPUs (global indexes) each job ran on
    for i in range(jobs):
        size = rng.choices((1, 2, 4, 8), (0.6, 0.2, 0.15, 0.05))[0]
        short = size == 1 and rng.random() < 0.2
        hours = rng.uniform(0.1, 0.9) if short else min(72.0, rng.lognormvariate(0.6, 1.0))
        hours *= LOAD_SCALE
        submitted = start + dt.timedelta(seconds=span * i / jobs + rng.uniform(0, 600))
        best: tuple[dt.datetime, int, list[int]] | None = None
        for n in range(NODES):
            node_free = free_at[n]
            chosen = sorted(range(PER_NODE), key=node_free.__getitem__)[:size]
            ready = max(submitted, node_free[chosen[-1]])
            if best is None or ready < best[0]:
                best = (ready, n, chosen)
        assert best is not None
        started, node_index, chosen = best
        ended = started + dt.timedelta(hours=hours)
        for g in chosen:
            free_at[node_index][g] = ended
        placed.append([node_index * PER_NODE + g for g in chosen])
        rows.append(
            Job(
                owner=users[rng.randrange(len(users))],
                queue=debug if short else normal,
                image=image,
                command=["python", "train.py"],
                gpus=size,
                time_limit_s=3600 if short else 72 * 3600,
                state=rng.choices(("completed", "failed", "cancelled"), (0.85, 0.1, 0.05))[0],
                node_id=gpus[node_index * PER_NODE].node_id,
                submitted_at=submitted,
                started_at=started,
                ended_at=ended,
            )
        )
    first_pk = _next_pk(Job)
    for pk, job in enumerate(rows, start=first_pk):
        job.pk = job.id = pk
    _copy(Job, rows)
    allocations: list[tuple[Any, ...]] = []
    samples: list[tuple[Any, ...]] = []
    charges: list[tuple[Any, ...]] = []
    rollups: list[tuple[Any, ...]] = []
    sampled: set[tuple[int, dt.datetime]] = set()
    rolled: set[tuple[int, dt.datetime]] = set()
    for job, on in zip(rows, placed, strict=True):
        assert job.started_at is not None and job.ended_at is not None
        util = rng.uniform(20, 95)
        for index in on:
            gpu = gpus[index]
            allocations.append((job.pk, gpu.pk, False, job.started_at, job.ended_at))
            ts = job.started_at + dt.timedelta(seconds=job.pk % 3600)
            while ts < job.ended_at:
                # Two jobs one after the other may share a GPU-hour (or, rarely, an
                # instant); the first one keeps it (as the unique constraints want).
                if (gpu.pk, ts) not in sampled:
                    sampled.add((gpu.pk, ts))
                    samples.append((gpu.pk, ts, util, job.pk))
                ts += dt.timedelta(hours=1)
            bucket = job.started_at.replace(minute=0, second=0, microsecond=0)
            while bucket < job.ended_at:
                held = (
                    min(job.ended_at, bucket + HOUR) - max(job.started_at, bucket)
                ).total_seconds() // 60
                if held > 0 and (gpu.pk, bucket) not in rolled:
                    rolled.add((gpu.pk, bucket))
                    minutes = int(held)
                    rollups.append(
                        (gpu.pk, bucket, minutes * 12, util, util, job.pk, job.owner_id)
                        + (minutes, minutes, minutes)
                    )
                bucket += HOUR
        hours = (job.ended_at - job.started_at).total_seconds() / 3600
        charges.append(
            (
                account_of[job.owner_id].pk,
                "charge",
                -Decimal(f"{hours * job.gpus:.3f}"),
                Decimal(0),
                f"bench-{job.pk}",
                job.pk,
                job.ended_at,
            )
        )
    _copy(Allocation, allocations, ("job", "gpu", "active", "allocated_at", "released_at"))
    _copy(GpuSample, samples, ("gpu", "ts", "util_pct", "job_id"))
    rollup_fields = ("gpu", "bucket", "samples", "util_mean", "util_max", "job", "user")
    _copy(GpuHourRollup, rollups, (*rollup_fields, "minutes", "busy_minutes", "held_minutes"))
    RollupCursor.objects.update_or_create(level="hour", defaults={"done_until": end})
    RollupCursor.objects.update_or_create(level="minute", defaults={"done_until": end})
    ledger_fields = ("account", "kind", "amount", "balance_after", "idempotency_key", "job")
    _copy(LedgerEntry, charges, (*ledger_fields, "created_at"))
    return end


def _next_pk(model: Any) -> int:
    from django.db.models import Max

    return int(model.objects.aggregate(m=Max("pk"))["m"] or 0) + 1


def _copy(model: Any, rows: list[Any], names: tuple[str, ...] | None = None) -> None:
    """Write `rows` into `model`'s table with PostgreSQL's COPY, the way `bulk_create`
    would (every field left out gets its default), at a fraction of its cost.

    `rows` are either model instances (every concrete field is read off them, the
    primary key included) or tuples of the fields in `names` (primary keys from the
    table's sequence). Afterwards the sequence moves past the largest key.
    """
    from django.db import connection, models

    fields = [f for f in model._meta.concrete_fields if not (names and f.primary_key)]
    if names is None:
        getters = [
            (lambda obj, f=f: f.get_db_prep_save(f.pre_save(obj, True), connection))
            if isinstance(f, models.JSONField) or getattr(f, "auto_now_add", False)
            else (lambda obj, a=f.attname: getattr(obj, a))
            for f in fields
        ]
        values = ([get(obj) for get in getters] for obj in rows)
    else:
        position = {model._meta.get_field(n).attname: i for i, n in enumerate(names)}
        missing = [f.attname for f in fields if f.attname not in position]
        defaults = {
            f.attname: f.get_db_prep_save(
                dt.datetime.now(dt.UTC) if getattr(f, "auto_now_add", False) else f.get_default(),
                connection,
            )
            for f in fields
            if f.attname in missing
        }
        order = [(position.get(f.attname), defaults.get(f.attname)) for f in fields]
        values = ([row[i] if i is not None else d for i, d in order] for row in rows)
    table = connection.ops.quote_name(model._meta.db_table)
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    with connection.cursor() as wrapper:
        cursor = wrapper.cursor  # psycopg's own: COPY is not in the DB-API
        with cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
            for row in values:
                copy.write_row(row)
        pk = model._meta.pk.column
        cursor.execute(
            f"SELECT setval(pg_get_serial_sequence(%s, %s), "
            f"(SELECT COALESCE(MAX({connection.ops.quote_name(pk)}), 1) FROM {table}))",
            [model._meta.db_table, pk],
        )


def _filled(admin_url: str, name: str) -> bool:
    """Does a database kept by an earlier `--keep` run exist, with its jobs?"""
    import psycopg

    url = admin_url.replace("postgres://", "postgresql://", 1).rsplit("/", 1)[0] + "/" + name
    try:
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT count(*) FROM jobqueue_job").fetchone()
    except psycopg.Error:
        return False
    return bool(row and row[0])


def _cpu_timed(call: Any, repeat: int) -> dict[str, float | None]:
    """CPU seconds of `call` (median): this process's, and its PostgreSQL backend's (read
    from /proc where the database runs on this machine; None elsewhere). Their sum is what
    the call costs however loaded the machine is; wall time on an idle one is about that."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = Path(f"/proc/{cursor.fetchone()[0]}/stat")

    def backend_s() -> float | None:
        try:
            fields = backend.read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    app, db = [], []
    for _ in range(repeat):
        cpu, db_before = time.process_time(), backend_s()
        call()
        app.append(time.process_time() - cpu)
        db_after = backend_s()
        if db_before is not None and db_after is not None:
            db.append(db_after - db_before)
    app_s = round(statistics.median(app), 3)
    db_s = round(statistics.median(db), 3) if db else None
    return {
        "year_report_app_cpu_s": app_s,
        "year_report_db_cpu_s": db_s,
        "year_report_cpu_s": None if db_s is None else round(app_s + db_s, 3),
    }


def _timed(call: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def _baseline(ref: str, bench_url: str, repeat: int) -> dict[str, Any]:
    """The year report's and page's figures of commit `ref`, measured by this bench on
    this (kept) database: a `git archive` of it in a temporary folder with this file as its
    benchmarks/reports.py (and this checkout's benchmarks/portal.py, whose database helpers
    it uses: an older commit may have no benchmarks/), run by this Python."""
    import subprocess
    import tempfile

    keys = (
        "year_report_s",
        "year_report_app_cpu_s",
        "year_report_db_cpu_s",
        "year_report_cpu_s",
        "page_html_cold_s",
        "page_with_charts_cold_s",
        "page_with_charts_cold_cpu_s",
        "page_html_cold_forecast_fitted_s",
        "page_with_charts_cold_forecast_fitted_s",
        "page_with_charts_cold_forecast_fitted_cpu_s",
        "page_html_warm_s",
        "page_with_charts_warm_s",
        "page_cold_forecast",
        "page_html_never_fitted_s",
        "page_with_chart_never_fitted_s",
        "page_with_chart_never_fitted_cpu_s",
        "forecast_fit_task_cpu_s",
    )
    with tempfile.TemporaryDirectory(prefix="reports-baseline-") as tree:
        archive = subprocess.run(["git", "archive", ref], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
        # The same measurements of both: this bench, run on the older commit's code.
        here = Path(__file__).resolve().parent
        Path(tree, "benchmarks").mkdir(exist_ok=True)
        for name in ("__init__.py", "portal.py", "reports.py"):
            Path(tree, "benchmarks", name).write_text((here / name).read_text())
        # Its DATABASE_URL names the kept database's base name: it appends "_bench" itself.
        env = {**os.environ, "DATABASE_URL": bench_url.removesuffix("_bench")}
        command = [sys.executable, "-m", "benchmarks.reports", "--keep", "--no-replay", "--json"]
        done = subprocess.run(
            [*command, "--repeat", str(repeat)],
            cwd=tree,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"baseline {ref}: {figures}", file=sys.stderr, flush=True)
    return {"ref": ref, **{key: figures.get(key) for key in keys}}


def _page_timings(staff: Any, period: Any, repeat: int) -> dict[str, Any]:
    """The year's report page as a browser gets it: the HTML page (GET /reports/, the view
    with its template), then the chart images it links (weekly, forecast), each through
    the test client (middleware, login, the view, the template; no network). Cold: caches
    emptied before each load; warm: the same page loaded again right after.

    Where the control worker fits the demand forecast (`reports.services.forecast_refresh`)
    "cold" also means the stored forecast is of an older data version: the page serves it
    and queues a fit (counted here, not sent). `never_fitted`: no forecast stored at all,
    the page says it is being computed and links the weekly chart only. The fit itself is
    timed apart (`forecast_fit_task_cpu_s`): the worker's cost, off the request path.
    Older code fits inside the page request when its cache is empty: its "cold" includes
    that fit, as before."""
    from unittest import mock

    from django.core.cache import cache
    from django.test import Client
    from django.urls import reverse

    try:
        from reports.models import DemandForecast
        from reports.services import forecast_refresh
    except ImportError:  # older code: the page fits the forecast itself (and caches it)
        from reports import forecast as older

        lab_demand_forecast = older.lab_demand_forecast  # type: ignore[attr-defined]
        worker_fits = False
    else:
        worker_fits = True

    client = Client()
    client.force_login(staff)
    page_url = f"{reverse('report_page')}?{period.query()}"

    def load(url: str) -> tuple[float, float, bytes]:
        wall, cpu = time.perf_counter(), time.process_time()
        response = client.get(url)
        if response.status_code != 200:
            raise RuntimeError(f"GET {url}: {response.status_code}")
        return time.perf_counter() - wall, time.process_time() - cpu, response.content

    def load_page(charts_linked: int = 2) -> list[tuple[float, float]]:
        """The page, then the charts its HTML links, as a browser loads them."""
        wall, cpu, html = load(page_url)
        charts = [
            unescape(src) for src in re.findall(r'<img class="chart" src="([^"]+)"', html.decode())
        ]
        if len(charts) != charts_linked:
            raise RuntimeError(f"the page links {len(charts)} charts, not {charts_linked}")
        return [(wall, cpu), *((w, c) for w, c, _png in map(load, charts))]

    def fit() -> float:
        cpu = time.process_time()
        if worker_fits:
            DemandForecast.objects.all().delete()
            forecast_refresh()
        else:
            lab_demand_forecast()
        spent = time.process_time() - cpu
        gc.collect()  # the fit's garbage is the worker's, not the next page's
        return spent

    cold: list[list[tuple[float, float]]] = []
    fitted: list[list[tuple[float, float]]] = []
    warm: list[list[tuple[float, float]]] = []
    never: list[list[tuple[float, float]]] = []
    fits: list[float] = []
    queued = mock.patch("reports.tasks.forecast_refresh.delay") if worker_fits else None
    delay = queued.start() if queued is not None else None
    try:
        for _ in range(repeat):
            cache.clear()
            if worker_fits:
                fits.append(fit())
                # The last fit is of an older data version: the page serves it, queues a fit.
                DemandForecast.objects.update(version="older")
            cold.append(load_page())
            warm.append(load_page())
            # Caches emptied but the demand forecast (lab-wide, not of the period, fitted
            # once per week and history change) fitted on the current data.
            cache.clear()
            fits.append(fit())
            fitted.append(load_page())
            if worker_fits:
                cache.clear()
                DemandForecast.objects.all().delete()
                never.append(load_page(charts_linked=1))
    finally:
        if queued is not None:
            queued.stop()
        if worker_fits:
            forecast_refresh()  # leave a current forecast for the next run

    def median(runs: list[list[tuple[float, float]]], pick: Any) -> float | None:
        if not runs:
            return None
        return round(statistics.median(pick(run) for run in runs), 3)

    return {
        "page_cold_forecast": "last fit, older data version (a fit queued)"
        if worker_fits
        else "fitted in the page request",
        "page_html_cold_s": median(cold, lambda run: run[0][0]),
        "page_with_charts_cold_s": median(cold, lambda run: sum(w for w, _c in run)),
        "page_with_charts_cold_cpu_s": median(cold, lambda run: sum(c for _w, c in run)),
        "page_html_cold_forecast_fitted_s": median(fitted, lambda run: run[0][0]),
        "page_with_charts_cold_forecast_fitted_s": median(
            fitted, lambda run: sum(w for w, _c in run)
        ),
        "page_with_charts_cold_forecast_fitted_cpu_s": median(
            fitted, lambda run: sum(c for _w, c in run)
        ),
        "page_html_warm_s": median(warm, lambda run: run[0][0]),
        "page_with_charts_warm_s": median(warm, lambda run: sum(w for w, _c in run)),
        "page_html_never_fitted_s": median(never, lambda run: run[0][0]),
        "page_with_chart_never_fitted_s": median(never, lambda run: sum(w for w, _c in run)),
        "page_with_chart_never_fitted_cpu_s": median(never, lambda run: sum(c for _w, c in run)),
        "forecast_fit_task_cpu_s": round(statistics.median(fits), 3) if fits else None,
        "forecast_fits_queued_by_pages": delay.call_count if delay is not None else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reports", description=__doc__)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--profile", action="store_true", help="print where the year report spends its time"
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the filled database afterwards, and reuse one kept by an earlier run",
    )
    parser.add_argument("--no-replay", action="store_true", help="measure only the year report")
    parser.add_argument(
        "--baseline",
        metavar="GIT_REF",
        help="also measure the year report and page of an older commit (this bench run on "
        "a `git archive` of it) on the same database, in this run",
    )
    args = parser.parse_args(argv)
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        sys.exit(
            "benchmarks.reports needs DATABASE_URL=postgres://… (the 2 s target is for PostgreSQL)"
        )
    bench_url, admin_url, bench_name = bench_database_url(url)
    reuse = args.keep and _filled(admin_url, bench_name)
    if not reuse:
        recreate_database(admin_url, bench_name)
    os.environ["DATABASE_URL"] = bench_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "labportal.settings")
    # A private cache, emptied before each cold page load (locmem: this process only).
    os.environ["CACHE_URL"] = "locmem://"
    # No parallel query (the lab's database has none to give): one backend does all the
    # work, so its CPU time is the query's cost.
    os.environ["PGOPTIONS"] = "-c max_parallel_workers_per_gather=0"
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.db.models import Count, Sum

    try:
        call_command("migrate", verbosity=0)
        began = time.perf_counter()
        end = dt.datetime(2026, 1, 1, tzinfo=dt.UTC) if reuse else _fill(args.jobs, args.seed)
        fill_s = time.perf_counter() - began
        print(f"fill_s {fill_s:.1f}", file=sys.stderr, flush=True)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
        from accounts.models import User
        from jobqueue.models import Job
        from reports.periods import period_of
        from reports.replay import ReplayOption, replay_options
        from reports.selectors import usage_report
        from reports.tables import report_tables
        from telemetry.models import GpuSample

        staff, _new = User.objects.get_or_create(username="bench-admin", is_staff=True)
        year = period_of(
            "custom", (end - dt.timedelta(days=365)).date(), (end - dt.timedelta(days=1)).date()
        )
        quarter = period_of(
            "custom", (end - dt.timedelta(days=91)).date(), (end - dt.timedelta(days=1)).date()
        )
        if args.profile:
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            profiler.runcall(
                lambda: report_tables(usage_report(period=year, viewer=staff, now=end))
            )
            pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
        baseline = _timed(lambda: Job.objects.aggregate(n=Count("id"), g=Sum("gpus")), args.repeat)
        print(f"baseline_job_aggregate_s {baseline:.3f}", file=sys.stderr, flush=True)
        report_s = _timed(
            lambda: report_tables(usage_report(period=year, viewer=staff, now=end)), args.repeat
        )
        print(f"year_report_s {report_s:.3f}", file=sys.stderr, flush=True)
        report_cpu_s = _cpu_timed(
            lambda: report_tables(usage_report(period=year, viewer=staff, now=end)), args.repeat
        )
        print(f"year_report_cpu_s {report_cpu_s}", file=sys.stderr, flush=True)
        page = _page_timings(staff, year, args.repeat)
        for key, value in page.items():
            print(f"{key} {value}", file=sys.stderr, flush=True)
        baseline_figures = _baseline(args.baseline, bench_url, args.repeat) if args.baseline else {}
        quarter_jobs = Job.objects.filter(
            submitted_at__gte=quarter.start, submitted_at__lt=quarter.end
        ).count()
        result: dict[str, Any] = {}
        if not args.no_replay:
            timings: dict[str, float] = {}
            began = time.perf_counter()
            outcomes = replay_options(
                period=quarter,
                options=[
                    ReplayOption("lab"),
                    ReplayOption("+8 A100", gpu_delta=8, gpu_model="A100"),
                ],
                timings=timings,
            )
            replay_s = time.perf_counter() - began
            result = {
                "quarter_jobs": quarter_jobs,
                "quarter_replay_s": round(replay_s, 1),
                # What the replay layer costs around the simulator: export of the job
                # history, the cluster and policy, and the figures of each outcome.
                "quarter_replay_layer_s": round(replay_s - timings["simulate_s"], 2),
                "quarter_replay_export_s": round(timings["export_s"], 2),
                "quarter_replay_simulate_s": round(timings["simulate_s"], 1),
                # The options run side by side in worker processes: their CPU summed.
                "quarter_replay_simulate_cpu_sum_s": round(timings["simulate_cpu_s"], 1),
                "quarter_replay_processes": int(timings["processes"]),
                "replay_outcomes": [o.as_dict() for o in outcomes],
            }
        result = {
            "jobs": Job.objects.count(),
            "samples": GpuSample.objects.count(),
            "gpus": NODES * PER_NODE,
            "fill_s": round(fill_s, 1),
            "baseline_job_aggregate_s": round(baseline, 3),
            "year_report_s": round(report_s, 3),
            **report_cpu_s,
            **page,
            **{f"baseline_{key}": value for key, value in baseline_figures.items()},
            **result,
        }
    finally:
        connection.close()
        if not args.keep:
            recreate_database(admin_url, bench_name, drop_only=True)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:28} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

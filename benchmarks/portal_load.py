"""The portal under load, for `make bench`: a big lab's database, pages under an open-loop load,
the scheduling pass with 2,000 waiting jobs, and telemetry ingest.

The database is the size of a busy lab after a few months: 50 members, 64 GPUs
on 16 nodes, 200 bookings, 100,000 finished jobs (with their allocations, over
8 weeks), 2,000 waiting, every GPU busy, and 1,000,000 GPU samples. Bulk rows
are made by PostgreSQL itself (``generate_series``), so generating it takes
seconds, not minutes. Everything runs on the bench's own database.
"""

from __future__ import annotations

import gzip
import os
import random
import statistics
import threading
import time
from datetime import timedelta
from typing import Any

import requests

from benchmarks import open_loop

PAGES = {
    "dashboard": "/",
    "queue page": "/jobs/queue/",
    "my jobs": "/jobs/",
    "calendar week": "/reservations/?view=week",
    "calendar day": "/reservations/",
    "GPUs live": "/gpus/",
    "my bookings": "/reservations/mine/",
    "credits": "/account/credits/",
    "API queue overview": "/api/queues/overview/",
}
NODES, GPUS_PER_NODE, MEMBERS = 16, 4, 50


def big_lab(
    *, finished: int = 100_000, waiting: int = 2_000, samples: int = 1_000_000, bookings: int = 200
) -> dict[str, Any]:
    """Fill the (empty, migrated) bench database; returns the member names."""
    from django.db import connection
    from django.utils import timezone

    from accounts.models import Category, User
    from cluster.models import Gpu, Node
    from jobqueue.models import ContainerImage, Queue
    from reservations.models import Reservation

    now = timezone.now()
    categories = [
        Category.objects.create(name=f"Bench {name}", fairshare_weight=w, max_queued_jobs=10_000)
        for name, w in (("PhD", 30), ("Master", 10), ("Staff", 20))
    ]
    users = [
        User(username=f"member{i:02d}", email=f"m{i}@lab.example", category=categories[i % 3])
        for i in range(MEMBERS)
    ]
    for user in users:
        user.set_unusable_password()
    User.objects.bulk_create(users)
    users = list(User.objects.filter(username__startswith="member").order_by("username"))
    image = ContainerImage.objects.get_or_create(reference="labportal/demo:local")[0]
    queue = Queue.objects.get(name="normal")
    gpus = []
    for n in range(NODES):
        node = Node.objects.create(
            name=f"big{n + 1:02d}", state=Node.State.UP, registered_at=now, agent_version="bench"
        )
        gpus += [
            Gpu(node=node, index=i, uuid=f"GPU-big{n + 1:02d}-{i}", model="A100", memory_mb=81920)
            for i in range(GPUS_PER_NODE)
        ]
    Gpu.objects.bulk_create(gpus)
    gpu_ids = list(Gpu.objects.filter(node__name__startswith="big").values_list("pk", flat=True))
    user_ids = [u.pk for u in users]
    # Bookings: each GPU gets consecutive 4-hour slots, every other 4 hours, from now on.
    rng = random.Random(7)
    for b in range(bookings):
        gpu = gpu_ids[b % len(gpu_ids)]
        slot = b // len(gpu_ids)
        start = now + timedelta(hours=2 + slot * 8)
        reservation = Reservation.objects.create(
            user_id=rng.choice(user_ids), start=start, end=start + timedelta(hours=4), note="bench"
        )
        reservation.gpus.add(gpu)
    params: dict[str, Any] = {
        "users": user_ids,
        "gpus": gpu_ids,
        "image": image.pk,
        "queue": queue.pk,
        "now": now,
        "nu": len(user_ids),
        "ng": len(gpu_ids),
    }
    job_columns = (
        "name, command, env, gpus, shared_slot, min_gpu_memory_mb, gpu_model, cpus, memory_mb,"
        " time_limit_s, preemptible, state, hold_reason, submitted_at, end_reason, container_id,"
        " log_tail, pending_reason, image_id, owner_id, queue_id, dispatch_count,"
        " start_resends, stop_resends"
    )
    # Every other NOT NULL column of a job takes its model default, so that a column added
    # to Job later fills itself here instead of failing the bench.
    rest, rest_values = _other_columns_with_defaults(job_columns)
    job_columns += "".join(f", {column}" for column in rest)
    params.update(rest_values)
    rest_values_sql = "".join(f", %({name})s" for name in rest_values)
    with connection.cursor() as cur:
        # Finished jobs over the last 8 weeks, 5 min to 6 h each, one allocation each.
        cur.execute(
            f"""
            WITH j AS (
              INSERT INTO jobqueue_job ({job_columns}, started_at, ended_at, exit_code, node_id)
              SELECT 'bench', '["sleep","1"]', '{{}}', 1, false, 0, '', 4, 16384, 86400, false,
                     'completed', '', s.started - interval '1 minute', '', '', '', '', %(image)s,
                     (%(users)s::bigint[])[1 + g %% %(nu)s], %(queue)s, 1, 0, 0{rest_values_sql},
                     s.started, s.started + s.len, 0, NULL
              FROM generate_series(1, %(finished)s) g,
                   LATERAL (SELECT %(now)s::timestamptz - (g::float / %(finished)s) * interval '56 days'
                                   - interval '6 hours' AS started,
                                   interval '5 minutes' + (g * 7919 %% 355) * interval '1 minute' AS len) s
              RETURNING id, started_at, ended_at
            )
            INSERT INTO jobqueue_allocation (job_id, gpu_id, active, allocated_at, released_at)
            SELECT j.id, (%(gpus)s::bigint[])[1 + j.id %% %(ng)s], false, j.started_at, j.ended_at
            FROM j
            """,
            {**params, "finished": finished},
        )
        # Every GPU busy with one running job; `waiting` jobs behind them.
        cur.execute(
            f"""
            WITH j AS (
              INSERT INTO jobqueue_job ({job_columns}, started_at, dispatched_at)
              SELECT 'bench', '["sleep","1"]', '{{}}', 1, false, 0, '', 4, 16384, 86400, false,
                     'running', '', %(now)s - interval '2 hours', '', 'c' || g, '', '', %(image)s,
                     (%(users)s::bigint[])[1 + g %% %(nu)s], %(queue)s, 1, 0, 0{rest_values_sql},
                     %(now)s - interval '1 hour', %(now)s - interval '1 hour'
              FROM generate_series(1, %(ng)s) g
              RETURNING id, started_at
            )
            INSERT INTO jobqueue_allocation (job_id, gpu_id, active, allocated_at)
            SELECT j.id, (%(gpus)s::bigint[])[(row_number() OVER (ORDER BY j.id))::int],
                   true, j.started_at
            FROM j
            """,
            params,
        )
        cur.execute(
            f"""
            INSERT INTO jobqueue_job ({job_columns})
            SELECT 'bench', '["sleep","1"]', '{{}}', 1 + (g %% 4 = 0)::int, false, 0, '', 4, 16384,
                   3600 * (1 + g %% 8), false, 'pending', '', %(now)s - g * interval '1 second', '', '',
                   '', '', %(image)s, (%(users)s::bigint[])[1 + g %% %(nu)s], %(queue)s, 0, 0, 0{rest_values_sql}
            FROM generate_series(1, %(waiting)s) g
            """,
            {**params, "waiting": waiting},
        )
        # GPU samples: the newest readings of every GPU, 5 s apart.
        cur.execute(
            """
            INSERT INTO telemetry_gpusample (gpu_id, ts, util_pct, mem_used_mb, temp_c, power_w, processes)
            SELECT (%(gpus)s::bigint[])[1 + g %% %(ng)s],
                   %(now)s - (g / %(ng)s) * interval '5 seconds',
                   (g %% 100), 40000, 60, 300, '[]'
            FROM generate_series(0, %(samples)s - 1) g
            """,
            {**params, "samples": samples},
        )
        cur.execute("ANALYZE")
    return {"members": [u.username for u in users]}


def _other_columns_with_defaults(given: str) -> tuple[list[str], dict[str, Any]]:
    """The job table's NOT NULL columns not in ``given`` (a column list), and their model
    defaults as typed parameters (``%(default_<column>)s``)."""
    from django.db import connection

    from jobqueue.models import Job

    named = {column.strip() for column in given.split(",")}
    columns, values = [], {}
    for field in Job._meta.concrete_fields:
        if field.primary_key or field.null or field.generated or field.column in named:
            continue
        default = field.get_default()  # a text column without one: ""
        if default is None:
            raise SystemExit(f"the bench does not fill jobqueue_job.{field.column}: add it")
        columns.append(field.column)
        values[f"default_{field.column}"] = field.get_db_prep_save(default, connection)
    return columns, values


def _session_cookies(usernames: list[str]) -> list[dict[str, str]]:
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore

    from accounts.models import User

    cookies = []
    for user in User.objects.filter(username__in=usernames):
        session = SessionStore()
        session[SESSION_KEY] = str(user.pk)
        session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
        session[HASH_SESSION_KEY] = user.get_session_auth_hash()
        session.create()
        cookies.append({settings.SESSION_COOKIE_NAME: session.session_key or ""})
    return cookies


def page_costs(usernames: list[str], repeats: int = 20) -> dict[str, dict[str, float]]:
    """Per page, in this process: CPU ms (min and median of `repeats`; the min is the
    page's own cost, the median also holds what else the machine did), SQL statements,
    and the answer's size as the page and as sent (gzipped, as a browser asks)."""
    from django.db import connection, reset_queries
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    client.cookies.load(_session_cookies(usernames[:1])[0])
    costs = {}
    for name, path in PAGES.items():
        cpu, size, queries = [], 0, 0
        for _ in range(repeats):
            reset_queries()
            with CaptureQueriesContext(connection) as captured:
                began = time.process_time()
                # As a browser asks: the CPU includes compressing the answer.
                response = client.get(path, HTTP_HOST="127.0.0.1", HTTP_ACCEPT_ENCODING="gzip")
                cpu.append((time.process_time() - began) * 1000)
            if response.status_code != 200:
                raise SystemExit(f"{path} answered {response.status_code} in the bench")
            wire, queries = len(response.content), len(captured.captured_queries)
            gzipped = response.get("Content-Encoding") == "gzip"
            size = len(gzip.decompress(response.content)) if gzipped else wire
        costs[name] = {
            "cpu_ms": round(statistics.median(cpu), 1),
            "cpu_min_ms": round(min(cpu), 1),
            "queries": queries,
            "kb": round(size / 1024, 1),
            "wire_kb": round(wire / 1024, 1),
        }
    return costs


def open_loop_pages(
    base: str,
    usernames: list[str],
    *,
    rates: list[float],
    seconds: float,
    saturation_rates: list[float],
    saturation_seconds: float,
) -> dict[str, Any]:
    """The pages under an open-loop load (fixed Poisson arrivals, see benchmarks.open_loop)
    at each of `rates`, then the saturation throughput: the rate at which the p95 over all
    pages passes 1 s. Each request is one of 50 members' (their own session cookie)."""

    cookies = _session_cookies(usernames)
    local = threading.local()

    def fetch(name: str) -> int:
        session = getattr(local, "session", None)
        if session is None:
            session = local.session = requests.Session()
            session.cookies.update(random.choice(cookies))
        return session.get(base + PAGES[name], timeout=30).status_code

    # Ten seconds at a low rate first, not counted: each web worker's first answers pay
    # for imports, template loading and caches, and a lone warm-up request reaches one
    # worker only.
    open_loop.run(fetch, list(PAGES), rate=5, seconds=10, seed=0)
    result: dict[str, Any] = {"rates": {}}
    for rate in rates:
        outcome = open_loop.run(fetch, list(PAGES), rate=rate, seconds=seconds, seed=int(rate))
        if outcome["errors"]:
            raise SystemExit(f"page requests failed at {rate}/s: {outcome['errors'][:3]}")
        result["rates"][rate] = outcome
    result["saturation"] = open_loop.saturation(
        fetch, list(PAGES), rates=saturation_rates, seconds=saturation_seconds
    )
    result["load_average"] = round(os.getloadavg()[0], 1)
    return result


def pass_times(repeats: int = 5) -> dict[str, Any]:
    """A scheduling pass in the portal (load, plan, store) with the big lab's queue, in ms."""
    from jobqueue.models import Job
    from scheduling.passes import scheduling_pass

    waiting = Job.objects.filter(state__in=Job.WAITING_STATES).count()
    times = []
    cpu = []
    for _ in range(repeats):
        began = time.process_time()
        result = scheduling_pass()
        cpu.append((time.process_time() - began) * 1000)
        times.append(result.duration_ms)
    return {
        "waiting": waiting,
        "pass_median_ms": round(statistics.median(times), 1),
        "pass_max_ms": round(max(times), 1),
        # This process's CPU: the wall time above also holds PostgreSQL's share and, on
        # a busy machine, the time spent waiting for a core (hence the load average).
        "pass_cpu_median_ms": round(statistics.median(cpu), 1),
        "load_average": round(os.getloadavg()[0], 1),
        "started": len(result.started),
    }


def ingest_rates(batches: int = 40, per_batch: int = 384) -> dict[str, float]:
    """Telemetry ingest through the service, and the bare bulk insert of the same rows (its bound)."""
    from django.utils import timezone

    from cluster.models import Gpu
    from telemetry.models import GpuSample
    from telemetry.services import samples_ingest

    gpus = list(Gpu.objects.filter(node__name="big01").order_by("index"))
    now = timezone.now().timestamp()

    def wire(b: int) -> list[dict[str, Any]]:
        return [
            {
                "gpu_uuid": gpus[i % len(gpus)].uuid,
                "ts": now - 600 + b + i * 0.001,
                "util_pct": 50.0,
                "mem_used_mb": 1000,
                "temp_c": 60.0,
                "power_w": 250.0,
                "processes": [],
            }
            for i in range(per_batch)
        ]

    payloads = [wire(b) for b in range(batches)]
    began = time.perf_counter()
    for payload in payloads:
        samples_ingest(node_name="big01", samples=payload)
    service = batches * per_batch / (time.perf_counter() - began)
    stamp = timezone.now() - timedelta(hours=1)
    rows = [
        [
            GpuSample(
                gpu=gpus[i % len(gpus)],
                ts=stamp + timedelta(seconds=b, milliseconds=i),
                util_pct=50.0,
                mem_used_mb=1000,
                temp_c=60.0,
                power_w=250.0,
                processes=[],
            )
            for i in range(per_batch)
        ]
        for b in range(batches)
    ]
    began = time.perf_counter()
    for batch in rows:
        GpuSample.objects.bulk_create(batch)
    bare = batches * per_batch / (time.perf_counter() - began)
    return {"ingest_samples_per_s": round(service), "bulk_insert_samples_per_s": round(bare)}

"""Telemetry benchmarks on PostgreSQL: ingest, rollup, /metrics and the chart endpoint.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/labportal CACHE_URL=redis://127.0.0.1:6379/0 \
        python -m benchmarks.telemetry [--json] [--only ingest|rollup|metrics|chart]

It creates (and afterwards drops) a database `<name>_telemetry_bench` next to the one in
DATABASE_URL, and measures, each against a baseline taken in the same run:

- ingest: GPU samples stored per second through the agents' real path (the
  `control.samples_ingest` task: signature and replay check, validation, insert, latest
  status; the agents' signing is timed apart), against a bare `bulk_create` of the same
  rows, interleaved with it;
- rollup: one day of samples for `--gpus` GPUs at a 5-second interval rolled up into
  minutes and hours, against a plain GROUP BY over the same rows (no writes);
- /metrics with `--gpus` GPUs and `--pending` waiting jobs, against GET /healthz;
- the chart endpoint for a year of hourly data on one node (8 GPUs), against /healthz.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from benchmarks.portal import migrated_bench_database

GPUS_PER_NODE = 8


def _median_ms(call: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        call()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def _lab(gpus: int) -> list[Any]:
    from cluster.models import Gpu, Node

    nodes = Node.objects.bulk_create(
        Node(
            name=f"bench{n:04d}",
            state=Node.State.UP,
            registered_at=datetime.now(tz=UTC),
            last_heartbeat=datetime.now(tz=UTC),
            gpu_backend="nvml",
            runtime="docker",
        )
        for n in range(max(1, gpus // GPUS_PER_NODE))
    )
    Gpu.objects.bulk_create(
        Gpu(
            node=node,
            index=i,
            uuid=f"GPU-{node.name}-{i}",
            model="NVIDIA H100 80GB HBM3",
            memory_mb=81559,
        )
        for node in nodes
        for i in range(GPUS_PER_NODE)
    )
    return nodes


def bench_ingest(samples_total: int) -> dict[str, Any]:
    """Samples per second through the real ingest task, and through a bare bulk_create."""
    from cluster.models import Gpu, NodeToken
    from telemetry.models import GpuSample
    from telemetry.tasks import samples_ingest

    nodes = _lab(1024)
    secrets = {node.name: NodeToken.issue(node_name=node.name)[1] for node in nodes}
    uuids = {node.name: [f"GPU-{node.name}-{i}" for i in range(GPUS_PER_NODE)] for node in nodes}
    # Each message is one node's batch: 6 sampling rounds of its 8 GPUs (the agent's default).
    rounds_per_batch = 6
    per_message = rounds_per_batch * GPUS_PER_NODE
    messages = max(1, samples_total // per_message)
    # Recent readings (as from live agents), half a second apart so none repeats.
    start = time.time() - 120.0
    batches: list[tuple[str, list[dict[str, Any]]]] = []
    for m in range(messages):
        node = nodes[m % len(nodes)]
        ts0 = start + (m // len(nodes)) * rounds_per_batch * 0.5
        batches.append(
            (
                node.name,
                [
                    {
                        "gpu_uuid": uuid,
                        "ts": ts0 + r * 0.5,
                        "util_pct": 50.0 + r,
                        "mem_used_mb": 40000,
                        "mem_total_mb": 81559,
                        "temp_c": 60.0,
                        "power_w": 400.0,
                        "sm_clock_mhz": 1980,
                        "ecc_errors": 0,
                        "xid_errors": 0,
                        "processes": [],
                    }
                    for r in range(rounds_per_batch)
                    for uuid in uuids[node.name]
                ],
            )
        )
    from protocol.signing import REPORT_TTL_S, key_from_token, sign, token_kid

    keys = {name: (key_from_token(secret), token_kid(secret)) for name, secret in secrets.items()}
    # Signed as live agents sign them (protocol.signing), on their own machines: the signing
    # is timed apart, and only the portal's side (check, validation, store) counts.
    began = time.perf_counter()
    signed = [
        (
            node_name,
            sign(
                keys[node_name][0],
                kid=keys[node_name][1],
                task="control.samples_ingest",
                node=node_name,
                args=[batch],
                ttl_s=REPORT_TTL_S,
            ),
            batch,
        )
        for node_name, batch in batches
    ]
    signing = time.perf_counter() - began

    # The baseline: the same readings as plain rows, a bulk_create per message, a million
    # seconds earlier so that none collides. Interleaved with the real path, ten messages
    # at a time, so that load from elsewhere on the machine weighs on both alike.
    gpu_pk = dict(Gpu.objects.values_list("uuid", "pk"))
    bare_batches = [
        [
            GpuSample(
                gpu_id=gpu_pk[sample["gpu_uuid"]],
                ts=datetime.fromtimestamp(sample["ts"] - 10**6, tz=UTC),
                **{k: v for k, v in sample.items() if k not in ("gpu_uuid", "ts")},
            )
            for sample in batch
        ]
        for _node_name, batch in batches
    ]
    real = bare = real_cpu = bare_cpu = 0.0
    for first in range(0, len(signed), 10):
        began, began_cpu = time.perf_counter(), time.process_time()
        for node_name, auth, batch in signed[first : first + 10]:
            assert samples_ingest(node_name, auth, batch) == "ok"
        real += time.perf_counter() - began
        real_cpu += time.process_time() - began_cpu
        began, began_cpu = time.perf_counter(), time.process_time()
        for rows in bare_batches[first : first + 10]:
            GpuSample.objects.bulk_create(rows)
        bare += time.perf_counter() - began
        bare_cpu += time.process_time() - began_cpu
    stored = GpuSample.objects.count() // 2
    assert stored == messages * per_message
    from django.conf import settings

    return {
        "cache": str(settings.CACHES["default"]["BACKEND"]).rsplit(".", 1)[-1],
        "samples": stored,
        "samples_per_message": per_message,
        "ingest_samples_per_s": round(stored / real),
        "baseline_bulk_create_samples_per_s": round(stored / bare),
        "ratio_to_baseline": round(bare / real, 2),
        "portal_cpu_ms_per_message": round(real_cpu * 1000 / messages, 2),
        "baseline_cpu_ms_per_message": round(bare_cpu * 1000 / messages, 2),
        "agent_signing_ms_per_message": round(signing * 1000 / messages, 2),
    }


def bench_rollup(gpus: int, hours: int) -> dict[str, float]:
    """One day (or `hours`) of 5-second samples for `gpus` GPUs, rolled up; and a bare GROUP BY."""
    from django.db import connection

    from telemetry.models import GpuHourRollup, GpuMinuteRollup, GpuSample
    from telemetry.rollups import floor_to, rollups_run

    GpuSample.objects.all().delete()
    day = floor_to(datetime.now(tz=UTC) - timedelta(hours=hours + 1), timedelta(hours=1))
    end = day + timedelta(hours=hours)
    began = time.perf_counter()
    with connection.cursor() as cur:
        cur.execute(
            f"""
            INSERT INTO {GpuSample._meta.db_table}
                (gpu_id, ts, util_pct, mem_used_mb, temp_c, power_w, processes)
            SELECT g.id, t, (extract(epoch FROM t)::bigint + g.id * 7) %% 100, 30000, 60, 350, '[]'
            FROM (SELECT id FROM cluster_gpu ORDER BY id LIMIT %s) g,
                 generate_series(%s::timestamptz, %s::timestamptz - interval '5 seconds',
                                 interval '5 seconds') t
            """,
            [gpus, day, end],
        )
        samples = cur.rowcount
        cur.execute(f"ANALYZE {GpuSample._meta.db_table}")
    load = time.perf_counter() - began

    began = time.perf_counter()
    with connection.cursor() as cur:
        cur.execute(
            f"""SELECT count(*) FROM (
                SELECT gpu_id, date_trunc('minute', ts), avg(util_pct), max(mem_used_mb),
                       max(temp_c), avg(power_w)
                FROM {GpuSample._meta.db_table} WHERE ts >= %s AND ts < %s GROUP BY 1, 2) m""",
            [day, end],
        )
        cur.fetchone()
    group_by = time.perf_counter() - began

    began = time.perf_counter()
    result = rollups_run(now=end + timedelta(seconds=1), budget_s=3600)
    rollup = time.perf_counter() - began
    assert result.caught_up
    began = time.perf_counter()
    rollups_run(now=end + timedelta(seconds=1), budget_s=3600)
    rerun = time.perf_counter() - began
    return {
        "gpus": gpus,
        "hours": hours,
        "samples": samples,
        "load_samples_s": round(load, 1),
        "rollup_s": round(rollup, 1),
        "rollup_samples_per_s": round(samples / rollup),
        "rerun_caught_up_s": round(rerun, 2),
        "baseline_group_by_s": round(group_by, 1),
        "minute_rows": GpuMinuteRollup.objects.count(),
        "hour_rows": GpuHourRollup.objects.count(),
    }


def _client() -> Any:
    from django.test import Client

    return Client()


def bench_metrics(gpus: int, pending: int) -> dict[str, float]:
    """/metrics with the lab of `gpus` GPUs, half held by running jobs, and `pending` waiting jobs."""
    from accounts.models import User
    from cluster.models import Gpu
    from jobqueue.models import Allocation, ContainerImage, Job, Queue
    from telemetry.models import ScrapeToken

    if not Gpu.objects.exists():  # run alone (--only metrics), without the ingest's lab
        _lab(gpus)
    Gpu.objects.update(
        util_pct=70.0,
        mem_used_mb=30000,
        temp_c=60.0,
        power_w=350.0,
        sampled_at=datetime.now(tz=UTC),
    )
    users = User.objects.bulk_create(User(username=f"member{i}") for i in range(50))
    queue = Queue.objects.get(name="normal")
    image, _ = ContainerImage.objects.get_or_create(reference="pytorch/pytorch:2.4.0")
    gpu_ids = list(Gpu.objects.order_by("pk").values_list("pk", flat=True))[:gpus]
    now = datetime.now(tz=UTC)

    def job(i: int, state: str) -> Job:
        return Job(
            owner=users[i % len(users)],
            queue=queue,
            image=image,
            command=["python", "train.py"],
            time_limit_s=3600,
            state=state,
            submitted_at=now - timedelta(minutes=i % 600),
            started_at=now if state == Job.State.RUNNING else None,
        )

    Job.objects.bulk_create((job(i, Job.State.PENDING) for i in range(pending)), batch_size=2000)
    running = Job.objects.bulk_create(job(i, Job.State.RUNNING) for i in range(len(gpu_ids) // 2))
    Allocation.objects.bulk_create(
        Allocation(job=j, gpu_id=gpu_id) for j, gpu_id in zip(running, gpu_ids, strict=False)
    )
    _token, secret = ScrapeToken.issue(name="bench")
    client = _client()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
    response = client.get("/metrics", **auth)
    assert response.status_code == 200
    from core.metrics import metrics_registry

    registry = metrics_registry()  # what /metrics serves (python -m benchmarks.metrics: its writer)

    return {
        "gpus": len(gpu_ids),
        "pending_jobs": pending,
        "metrics_ms": round(_median_ms(lambda: client.get("/metrics", **auth), 10), 1),
        "metrics_bytes": len(response.content),
        "collect_only_ms": round(_median_ms(lambda: list(registry.collect()), 10), 1),
        "baseline_healthz_ms": round(_median_ms(lambda: client.get("/healthz"), 10), 2),
    }


def bench_chart() -> dict[str, float]:
    """GET /api/telemetry/gpu-series/ for a year of hourly rows of one node's 8 GPUs."""
    from accounts.models import User
    from cluster.models import Gpu, Node
    from telemetry.models import GpuHourRollup
    from telemetry.rollups import HOUR, floor_to

    node = Node.objects.order_by("name").first() or _lab(GPUS_PER_NODE)[0]
    gpus = list(Gpu.objects.filter(node=node))
    top = floor_to(datetime.now(tz=UTC), HOUR)
    GpuHourRollup.objects.bulk_create(
        (
            GpuHourRollup(
                gpu=gpu,
                bucket=top - timedelta(hours=h),
                samples=720,
                util_mean=float(h % 100),
                util_max=99.0,
                mem_used_max_mb=30000,
                minutes=60,
                busy_minutes=60,
                held_minutes=60,
            )
            for gpu in gpus
            for h in range(1, 365 * 24 + 1)
        ),
        batch_size=5000,
        ignore_conflicts=True,
    )
    user = User.objects.create_user(username="bench-viewer", password="x")
    client = _client()
    client.force_login(user)
    url = f"/api/telemetry/gpu-series/?range=365d&node={node.name}"
    assert client.get(url).status_code == 200
    return {
        "hour_rows": GpuHourRollup.objects.filter(gpu__node=node).count(),
        "chart_year_400_points_ms": round(_median_ms(lambda: client.get(url), 5), 1),
        "chart_year_2000_points_ms": round(
            _median_ms(lambda: client.get(url + "&points=2000"), 5), 1
        ),
        "baseline_healthz_ms": round(_median_ms(lambda: client.get("/healthz"), 10), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--hours", type=int, default=24, help="rollup: hours of samples")
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--ingest-samples", type=int, default=60_000)
    parser.add_argument(
        "--only",
        action="append",
        choices=("ingest", "rollup", "metrics", "chart"),
        help="run only these figures (repeatable); all by default",
    )
    args = parser.parse_args(argv)
    wanted = set(args.only or ("ingest", "rollup", "metrics", "chart"))

    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        print("benchmarks.telemetry needs DATABASE_URL=postgres://…", file=sys.stderr)
        return 2
    cache_url = os.environ.get("CACHE_URL") or os.environ.get("CELERY_BROKER_URL", "")
    if "ingest" in wanted and not cache_url.startswith(("redis://", "rediss://")):
        # Report nonces go to the shared cache; production's is Redis, the demo's a file.
        print(
            "benchmarks.telemetry: ingest without CACHE_URL=redis://… measures the demo's file cache",
            file=sys.stderr,
        )
    os.environ.setdefault("ALLOWED_HOSTS", "testserver,127.0.0.1")
    figures: dict[str, Any] = {}
    with migrated_bench_database(url, "telemetry_bench"):
        runs = {
            "ingest": lambda: bench_ingest(args.ingest_samples),
            "rollup": lambda: bench_rollup(args.gpus, args.hours),
            "metrics": lambda: bench_metrics(args.gpus, args.pending),
            "chart": bench_chart,
        }
        for figure, run in runs.items():
            if figure not in wanted:
                continue
            figures[figure] = run()
            if not args.json:
                print(f"{figure}:", figures[figure], flush=True)
    if args.json:
        print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

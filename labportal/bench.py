"""Portal benchmarks: API submit throughput and time from submit to a running job.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/labportal \\
    CELERY_BROKER_URL=redis://127.0.0.1:6379/0 python -m labportal.bench --json

It creates (and afterwards drops) a database `<name>_bench` next to the one in
DATABASE_URL, serves the portal with gunicorn, and measures:

- the baseline of the same run: an authenticated read (GET /api/queues/), which
  bounds what any write can reach on this machine;
- submits through POST /api/jobs/, one at a time and with 8 in parallel, and in
  batches of 50 through POST /api/jobs/batch/ (a job array);
- time to start: a control worker with beat and an agent (simulated GPUs, the
  local-process runtime) run jobs while GPUs are free; submit → running, median and p95.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests

SLURM_SBATCH_REFERENCE = {"serial_per_s": 100.0, "parallel8_per_s": 220.0}
BATCH = 50  # jobs per POST /api/jobs/batch/, like a job array


def bench_database_url(url: str) -> tuple[str, str, str]:
    parts = urlsplit(url)
    name = parts.path.lstrip("/") + "_bench"
    admin = urlunsplit(parts._replace(path="/postgres"))
    return urlunsplit(parts._replace(path="/" + name)), admin, name


def recreate_database(admin_url: str, name: str, drop_only: bool = False) -> None:
    import psycopg

    with psycopg.connect(
        admin_url.replace("postgres://", "postgresql://", 1), autocommit=True
    ) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not drop_only:
            conn.execute(f'CREATE DATABASE "{name}"')


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def timed_requests(session_factory: Any, count: int, threads: int, call: Any) -> float:
    """Run `count` calls over `threads` threads; returns calls per second."""
    per_thread = [count // threads + (1 if i < count % threads else 0) for i in range(threads)]
    errors: list[str] = []

    def work(n: int) -> None:
        session = session_factory()
        for _ in range(n):
            response = call(session)
            if response.status_code >= 300:
                errors.append(f"{response.status_code} {response.text[:200]}")

    workers = [threading.Thread(target=work, args=(n,)) for n in per_thread]
    began = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise SystemExit(f"benchmark requests failed: {errors[:3]}")
    return count / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--serial", type=int, default=300, help="submits one at a time")
    parser.add_argument("--parallel", type=int, default=800, help="submits with 8 clients")
    parser.add_argument("--starts", type=int, default=20, help="jobs for the time-to-start figure")
    parser.add_argument("--web-workers", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    source = os.environ.get("DATABASE_URL", "")
    if not source.startswith("postgres"):
        print(
            "labportal.bench needs PostgreSQL: set DATABASE_URL=postgres://… (it creates its own _bench database).",
            file=sys.stderr,
        )
        return 2
    bench_url, admin_url, bench_name = bench_database_url(source)
    recreate_database(admin_url, bench_name)
    os.environ["DATABASE_URL"] = bench_url
    var_dir = Path(tempfile.mkdtemp(prefix="labportal-bench-"))
    os.environ["LABPORTAL_VAR_DIR"] = str(var_dir)
    # Measure production settings, not the demo's DEBUG mode; the simulated agent of the
    # time-to-start figure is allowed explicitly.
    os.environ.update(
        {
            "DEBUG": "false",
            "SECRET_KEY": "labportal-bench-" + os.urandom(16).hex(),
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "LABPORTAL_ALLOW_SIMULATION": "true",
            "LOG_LEVEL": "WARNING",
        }
    )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "labportal.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from labportal.devstack import Stack, free_port, wait_for_port

    call_command("migrate", verbosity=0)
    token, node_tokens = _seed()
    stack = Stack(env={**os.environ, "PYTHONUNBUFFERED": "1"}, log_dir=var_dir / "logs")
    results: dict[str, Any] = {}
    try:
        port = free_port()
        stack.web(port, workers=args.web_workers)
        wait_for_port(port)
        base = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {token}"}

        def session() -> requests.Session:
            s = requests.Session()
            s.headers.update(headers)
            return s

        payload = {
            "image": "labportal/demo:local",
            "command": ["sleep", "1"],
            "gpus": 1,
            "time_limit_s": 600,
        }
        submit = lambda s: s.post(f"{base}/api/jobs/", json=payload)  # noqa: E731
        read = lambda s: s.get(f"{base}/api/queues/")  # noqa: E731
        timed_requests(session, 50, 2, read)  # warm up every worker
        results["baseline_read_serial_per_s"] = round(
            timed_requests(session, args.serial, 1, read), 1
        )
        results["submit_serial_per_s"] = round(timed_requests(session, args.serial, 1, submit), 1)
        results["submit_parallel8_per_s"] = round(
            timed_requests(session, args.parallel, 8, submit), 1
        )
        batch = {"jobs": [payload] * BATCH}
        submit_batch = lambda s: s.post(f"{base}/api/jobs/batch/", json=batch)  # noqa: E731
        batches = max(1, args.serial // BATCH)
        results["submit_batch_jobs_per_s"] = round(
            timed_requests(session, batches, 1, submit_batch) * BATCH, 1
        )
        results["slurm_sbatch_reference"] = SLURM_SBATCH_REFERENCE
        results.update(
            _time_to_start(stack, base, session, node_tokens, settings, args.starts, var_dir)
        )
    finally:
        stack.stop()
        from django.db import connections

        connections.close_all()
        recreate_database(admin_url, bench_name, drop_only=True)
    if args.json:
        print(json.dumps(results))
    else:
        print(f"{'figure':<34}{'LabPortal':>12}{'reference':>12}")
        print(
            f"{'authenticated read, 1 client':<34}{results['baseline_read_serial_per_s']:>10}/s{'':>12}"
        )
        print(
            f"{'submit, 1 client':<34}{results['submit_serial_per_s']:>10}/s{SLURM_SBATCH_REFERENCE['serial_per_s']:>10}/s (sbatch)"
        )
        print(
            f"{'submit, 8 clients':<34}{results['submit_parallel8_per_s']:>10}/s{SLURM_SBATCH_REFERENCE['parallel8_per_s']:>10}/s (sbatch)"
        )
        print(
            f"{'submit, batches of 50, 1 client':<34}{results['submit_batch_jobs_per_s']:>10}/s{SLURM_SBATCH_REFERENCE['serial_per_s']:>10}/s (sbatch)"
        )
        print(f"{'time to start, median':<34}{results['time_to_start_p50_s']:>11}s")
        print(f"{'time to start, p95':<34}{results['time_to_start_p95_s']:>11}s")
    return 0


def _seed() -> tuple[str, list[tuple[str, str]]]:
    from accounts.models import Category, PersonalAccessToken, User
    from cluster.models import NodeToken
    from jobqueue.models import ContainerImage

    category = Category.objects.create(
        name="Bench", max_queued_jobs=100_000, max_concurrent_gpus=64
    )
    user = User.objects.create_user(
        "bench", "bench@lab.example", "bench-password", category=category
    )
    _pat, secret = PersonalAccessToken.issue(user=user, name="bench")
    ContainerImage.objects.create(reference="labportal/demo:local")
    from agent.gpu.simulated import simulated_gpu_uuid
    from cluster.models import Gpu, Node

    nodes = []
    for name in ("bench-node-1",):
        _token, node_secret = NodeToken.issue(node_name=name)
        nodes.append((name, node_secret))
        # The GPUs the simulated agent will register, so submits are accepted before it starts.
        node = Node.objects.create(name=name, state=Node.State.UP)
        for index in range(8):
            Gpu.objects.create(
                node=node,
                index=index,
                uuid=simulated_gpu_uuid(name, index),
                model="Simulated A100 80GB",
                memory_mb=81920,
            )
    return secret, nodes


def _time_to_start(
    stack: Any,
    base: str,
    session: Any,
    node_tokens: list[tuple[str, str]],
    settings: Any,
    count: int,
    var_dir: Path,
) -> dict[str, Any]:
    from cluster.models import Gpu
    from jobqueue.models import Job

    # The throughput runs left thousands of jobs waiting; time to start is measured on a free cluster.
    Job.objects.filter(state__in=Job.WAITING_STATES).update(state=Job.State.CANCELLED)
    broker = settings.CELERY_BROKER_URL
    if broker.startswith("filesystem://"):
        broker = f"filesystem://{settings.BROKER_DIR / 'out'}"
    stack.control_worker(var_dir / "beat-schedule")
    for name, secret in node_tokens:
        stack.agent(
            name=name,
            token=secret,
            broker=broker,
            runtime="local",
            gpus=8,
            state_dir=var_dir / name,
        )
    deadline = time.monotonic() + 90
    while Gpu.objects.filter(node__name=node_tokens[0][0]).count() < 8:
        stack.check_alive()
        if time.monotonic() > deadline:
            raise SystemExit(
                "the bench agent did not register in 90 s:\n"
                + stack.tail(f"agent-{node_tokens[0][0]}")
            )
        time.sleep(0.5)
    s = session()
    waits: list[float] = []
    for _ in range(count):
        job_id = s.post(
            f"{base}/api/jobs/",
            json={
                "image": "labportal/demo:local",
                "command": ["sleep", "0.5"],
                "gpus": 1,
                "time_limit_s": 600,
            },
        ).json()["id"]
        deadline = time.monotonic() + 60
        while True:
            job = Job.objects.get(pk=job_id)
            if job.started_at is not None:
                waits.append((job.started_at - job.submitted_at).total_seconds())
                break
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"job {job_id} did not start within 60 s:\n{stack.tail('control')}"
                )
            time.sleep(0.05)
    return {
        "time_to_start_p50_s": round(statistics.median(waits), 2),
        "time_to_start_p95_s": round(percentile(waits, 0.95), 2),
        "time_to_start_jobs": len(waits),
    }


if __name__ == "__main__":
    sys.exit(main())

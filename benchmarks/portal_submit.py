"""In-process CPU per API submit: POST /api/jobs/ with a token, through Django's whole stack.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/labportal \\
    python -m benchmarks.portal_submit [--submits 300] [--rounds 3] [--profile N] [--queries]

It creates (and afterwards drops) a database `<name>_bench_submit` next to the one in
DATABASE_URL, with production settings (DEBUG=false), and sends the bench's submit
(benchmarks.portal) through Django's test client, which runs every middleware, DRF's
authentication, the view, job_submit and the rendering, but no socket and no web
server. It prints the process CPU time per submit of each round (the best is the
least disturbed by other work on the machine), the SQL statements of one submit, and,
with --profile, the functions that cost the most over that many submits.

The figure is a comparison: measure the code before and after a change in the same
session, alternating, on the same machine. It imports only Django and the portal, so
a copy of this file can measure an older tree (PYTHONPATH=<that tree>).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from benchmarks.portal import bench_database_url, recreate_database, seed_member

PAYLOAD = {
    "image": "labportal/demo:local",
    "command": ["sleep", "1"],
    "gpus": 1,
    "time_limit_s": 600,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--submits", type=int, default=300, help="submits per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", type=int, default=0, help="profile this many submits")
    parser.add_argument("--queries", action="store_true", help="print one submit's SQL")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    source = os.environ.get("DATABASE_URL", "")
    if not source.startswith("postgres"):
        print("benchmarks.portal_submit needs DATABASE_URL=postgres://…", file=sys.stderr)
        return 2
    url, admin, name = bench_database_url(source, "bench_submit")
    recreate_database(admin, name)
    os.environ.update(
        {
            "DATABASE_URL": url,
            "LABPORTAL_VAR_DIR": tempfile.mkdtemp(prefix="labportal-bench-submit-"),
            "DEBUG": "false",
            # The benchmark measures the portal's capacity, not its rate limits.
            "LABPORTAL_API_RATE": "off",
            "LABPORTAL_API_RATE_SUBMIT": "off",
            "SECRET_KEY": "labportal-bench-" + os.urandom(16).hex(),
            "ALLOWED_HOSTS": "127.0.0.1,localhost,testserver",
            "LOG_LEVEL": "WARNING",
        }
    )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "labportal.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, connections
    from django.test import Client

    try:
        call_command("migrate", verbosity=0)
        # DEBUG=false resolves static names through the manifest, as in production.
        call_command("collectstatic", interactive=False, verbosity=0)
        secret = _seed()
        client = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
        body = json.dumps(PAYLOAD)

        def submit() -> None:
            response = client.post("/api/jobs/", body, content_type="application/json")
            if response.status_code != 201:
                raise SystemExit(
                    f"submit failed: {response.status_code} {response.content[:300]!r}"
                )

        for _ in range(30):  # warm up: imports, caches, the connection
            submit()
        # request_started empties connection.queries: record the statements as they run.
        captured: list[str] = []

        def record(
            execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
        ) -> Any:
            captured.append(sql)
            return execute(sql, params, many, context)

        with connection.execute_wrapper(record):
            submit()
        rounds = []
        for _ in range(args.rounds):
            began = time.process_time()
            for _ in range(args.submits):
                submit()
            rounds.append((time.process_time() - began) * 1000 / args.submits)
        result = {
            "cpu_ms_per_submit_rounds": [round(r, 2) for r in rounds],
            "cpu_ms_per_submit_best": round(min(rounds), 2),
            "queries_per_submit": len(captured),
        }
        if args.json:
            print(json.dumps(result))
        else:
            print(
                f"in-process CPU per submit: best {result['cpu_ms_per_submit_best']} ms "
                f"(rounds of {args.submits}: {result['cpu_ms_per_submit_rounds']} ms); "
                f"{result['queries_per_submit']} SQL statements per submit"
            )
        if args.queries:
            for sql in captured:
                print("  ", sql[:400])
        if args.profile:
            profiler = cProfile.Profile(time.process_time)  # CPU, not waits on the database
            profiler.enable()
            for _ in range(args.profile):
                submit()
            profiler.disable()
            out = io.StringIO()
            stats = pstats.Stats(profiler, stream=out).sort_stats("cumulative")
            stats.print_stats(60)
            out.write("\n--- by own time ---\n")
            stats.sort_stats("tottime").print_stats(40)
            print(out.getvalue())
    finally:
        connections.close_all()
        recreate_database(admin, name, drop_only=True)
    return 0


def _seed() -> str:
    """The bench's lab (benchmarks.portal._seed): a member with a token, an image, 4 GPUs."""
    from cluster.models import Gpu, Node

    secret = seed_member()
    node = Node.objects.create(name="bench-node-1", state=Node.State.UP)
    for index in range(4):
        Gpu.objects.create(
            node=node,
            index=index,
            uuid=f"GPU-bench-{index}",
            model="Simulated A100 80GB",
            memory_mb=81920,
        )
    return secret


if __name__ == "__main__":
    sys.exit(main())

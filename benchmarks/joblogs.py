"""Benchmark: log streaming throughput, from a job's output to the portal's store and on
to a follower, against a raw copy of the same bytes through the same broker.

    DATABASE_URL=postgres://… CELERY_BROKER_URL=redis://… python -m benchmarks.joblogs --json

It creates (and afterwards drops) a database `<name>_joblogsbench`. The same output
(`--mib`, 50 MiB of numbered lines) goes, in the agent's 256 KiB chunks:

- baseline: through Redis and back (push each base64 chunk, pop it), nothing else;
- stored: as the agent sends it (`agent.logstream.chunk_message`, signed by the
  agent's reporter) through Redis, popped and handed to the control task
  (`control.job_log_chunk`: signature, nonce, the job's node, the idempotent write);
- follower: read back from offset 0 to the end by `?offset=` pages (1 MiB), as the
  job page and `labctl logs -f` do.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from typing import Any


def output(mib: int) -> bytes:
    lines = bytearray()
    i = 0
    while len(lines) < mib * 1024 * 1024:
        i += 1
        lines += f"step {i} loss {1 / i:.6f}\n".encode()
    return bytes(lines[: mib * 1024 * 1024])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from benchmarks.portal import (
        bench_database_url,
        production_settings_environment,
        recreate_database,
    )

    source = os.environ.get("DATABASE_URL", "")
    broker = os.environ.get("CELERY_BROKER_URL", "")
    if not source.startswith("postgres") or not broker.startswith("redis"):
        print("benchmarks.joblogs needs DATABASE_URL=postgres://… and CELERY_BROKER_URL=redis://…")
        return 2
    bench_url, admin_url, name = bench_database_url(source, "joblogsbench")
    recreate_database(admin_url, name)
    production_settings_environment("joblogsbench", DATABASE_URL=bench_url)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    try:
        call_command("migrate", verbosity=0)
        results = _measure(args, broker)
    finally:
        connection.close()
        recreate_database(admin_url, name, drop_only=True)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"log streaming of {results['mib']} MiB in {results['chunks']} chunks of 256 KiB")
        print(f"  baseline: raw copy through Redis  {results['baseline_mib_s']:>8.1f} MiB/s")
        print(f"  job output -> stored (control)    {results['stored_mib_s']:>8.1f} MiB/s")
        print(f"  stored -> follower (?offset=)     {results['follower_mib_s']:>8.1f} MiB/s")
        print(f"  stored equals the output (sha256) {results['identical']}")
    return 0


def _measure(args: argparse.Namespace, broker: str) -> dict[str, Any]:
    import redis

    from accounts.models import Category, User
    from agent.logstream import CHUNK_MAX_BYTES, chunk_message
    from agent.reporter import ControlReporter
    from cluster.models import Node, NodeToken
    from joblogs.selectors import latest_log, log_bytes, log_read
    from joblogs.tasks import job_log_chunk
    from jobqueue.models import ContainerImage, Job, Queue

    data = output(args.mib)
    pieces = [data[o : o + CHUNK_MAX_BYTES] for o in range(0, len(data), CHUNK_MAX_BYTES)]
    client = redis.Redis.from_url(broker)
    key = f"joblogsbench-{os.getpid()}"

    started = time.perf_counter()
    for offset, piece in zip(range(0, len(data), CHUNK_MAX_BYTES), pieces, strict=True):
        client.lpush(key, json.dumps(chunk_message(1, "bench", offset, piece, final=False)))
        client.brpop([key], timeout=5)
    baseline_s = time.perf_counter() - started

    category = Category.objects.create(name="bench")
    owner = User.objects.create(username="bench", category=category)
    node = Node.objects.create(name="bench01", state=Node.State.UP)
    _token, secret = NodeToken.issue(node_name="bench01")
    queue = Queue.objects.get_or_create(name="normal", defaults={"title": "Normal"})[0]
    job = Job.objects.create(
        owner=owner,
        queue=queue,
        image=ContainerImage.objects.get_or_create(reference="bench")[0],
        command=["true"],
        time_limit_s=3600,
        node=node,
        state=Job.State.RUNNING,
    )

    class RedisSender:
        def send_task(self, name: str, args: Any = None, **options: Any) -> None:
            client.lpush(key, json.dumps(args))

    reporter = ControlReporter(RedisSender(), "bench01", secret)
    started = time.perf_counter()
    for i, piece in enumerate(pieces):
        offset = i * CHUNK_MAX_BYTES
        final = i == len(pieces) - 1
        reporter.job_log_chunk(chunk_message(job.pk, "bench", offset, piece, final=final))
        popped = client.brpop([key], timeout=5)
        assert popped is not None
        node_name, auth, chunk = json.loads(popped[1])
        outcome = job_log_chunk.run(node_name, auth, chunk)
        assert outcome == "ok", outcome
    stored_s = time.perf_counter() - started

    log = latest_log(job)
    assert log is not None
    started = time.perf_counter()
    offset = 0
    while offset < log.received_end:
        offset = log_read(log, offset).next_offset
    follower_s = time.perf_counter() - started
    identical = (
        hashlib.sha256(b"".join(log_bytes(log))).hexdigest() == hashlib.sha256(data).hexdigest()
    )
    client.delete(key)
    mib = len(data) / 1024 / 1024
    return {
        "mib": args.mib,
        "chunks": len(pieces),
        "baseline_mib_s": round(mib / baseline_s, 1),
        "stored_mib_s": round(mib / stored_s, 1),
        "follower_mib_s": round(mib / follower_s, 1),
        "identical": identical,
    }


if __name__ == "__main__":
    sys.exit(main())

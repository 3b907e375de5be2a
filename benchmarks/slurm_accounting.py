"""Benchmark: one reconciliation pass of Slurm accounting holding 10,000 jobs.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/labportal python -m benchmarks.slurm_accounting

It creates (and afterwards drops) a database ``<name>_acctbench`` next to the one in
DATABASE_URL, with 100 members (95 with a unix login; the other 5 unix users are
nobody's, as on a shared cluster), and feeds ``sacct --json`` text in Slurm 22.05's own
format (each job is a copy of a real record, tests/slurm/data/sacct.json, with its id,
user, GPUs, state and times changed): 9,000 ended jobs and 1,000 still running.
Figures, all from this run:

- baseline: parsing the JSON alone (what every pass pays whatever it charges);
- first pass: parse + charge every job (10,000 ledger postings, one per job);
- re-run: the same accounting again at the same moment (nothing to charge);
- next window: five minutes later (the 1,000 running jobs are charged again).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

TEMPLATE = Path(__file__).resolve().parent.parent / "tests" / "slurm" / "data" / "sacct.json"


def sacct_json(*, jobs: int, running: int, users: int, now: datetime, seed: int = 7) -> str:
    """``sacct --json`` text of ``jobs`` jobs in 22.05's format, ``running`` of them not ended."""
    real = json.loads(TEMPLATE.read_text())
    template = next(j for j in real["jobs"] if j["state"]["current"] == "COMPLETED")
    rng = random.Random(seed)
    out = []
    base = int(now.timestamp()) - 40 * 3600
    for i in range(jobs):
        job = copy.deepcopy(template)
        job["job_id"] = 1000 + i
        job["user"] = job["association"]["user"] = f"u{rng.randrange(users):03d}"
        submitted = base + i * 12
        started = submitted + rng.randrange(0, 600)
        elapsed = rng.randrange(60, 8 * 3600)
        is_running = i >= jobs - running
        if is_running:
            started = int(now.timestamp()) - rng.randrange(600, 6 * 3600)
            elapsed = int(now.timestamp()) - started
        job["time"].update(
            submission=submitted,
            eligible=submitted,
            start=started,
            end=0 if is_running else started + elapsed,
            elapsed=elapsed,
        )
        job["state"]["current"] = (
            "RUNNING" if is_running else rng.choice(["COMPLETED"] * 8 + ["FAILED", "CANCELLED"])
        )
        for tres in job["tres"]["allocated"]:
            if tres["type"] == "gres" and tres["name"] == "gpu":
                tres["count"] = rng.choice([1, 1, 1, 2, 2, 4, 8])
        out.append(job)
    real["jobs"] = out
    return json.dumps(real)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--running", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from benchmarks.portal import (
        bench_database_url,
        production_settings_environment,
        recreate_database,
    )

    source = os.environ.get("DATABASE_URL", "")
    if not source.startswith("postgres"):
        print(
            "benchmarks.slurm_accounting needs PostgreSQL: set DATABASE_URL=postgres://…",
            file=sys.stderr,
        )
        return 2
    bench_url, admin_url, name = bench_database_url(source, "acctbench")
    recreate_database(admin_url, name)
    production_settings_environment(
        "acctbench",
        DATABASE_URL=bench_url,
        EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend",
    )
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    try:
        call_command("migrate", verbosity=0)
        results = _measure(args)
    finally:
        connection.close()
        recreate_database(admin_url, name, drop_only=True)

    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(
            f"Slurm accounting reconciliation, {results['jobs']:,} jobs ({results['running']:,} running)"
        )
        print(f"  baseline: parse sacct JSON        {results['baseline_parse_ms']:>9.0f} ms")
        print(f"  first pass (charges every job)    {results['first_ms']:>9.0f} ms")
        print(f"  re-run, nothing to charge (med 3) {results['rerun_ms']:>9.0f} ms")
        print(f"  next window (running jobs)        {results['next_window_ms']:>9.0f} ms")
        print(f"  ledger entries                    {results['ledger_entries']:>9,}")
        print(f"  re-run changed the ledger         {results['rerun_changed_ledger']!s:>9}")
    return 0


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    from accounts.models import CreditAccount, LedgerEntry, User
    from slurm.accounting import accounting_reconcile
    from slurm.cli import parse_sacct_json
    from slurm.models import UnixLogin

    users = 100
    for n in range(users):
        member = User.objects.create(username=f"member{n:03d}")
        if n < 95:
            UnixLogin.objects.create(user=member, username=f"u{n:03d}")
    now = datetime(2026, 3, 2, 12, 0, 30, tzinfo=UTC)
    text = sacct_json(jobs=args.jobs, running=args.running, users=users, now=now)

    def parse() -> Any:
        return parse_sacct_json(text)

    def timed(fn: Any) -> tuple[float, Any]:
        began = time.perf_counter()
        value = fn()
        return (time.perf_counter() - began) * 1000, value

    baseline = statistics.median(timed(parse)[0] for _ in range(3))
    first_ms, first = timed(lambda: accounting_reconcile(records=parse(), now=now))
    entries = LedgerEntry.objects.count()
    reruns = [timed(lambda: accounting_reconcile(records=parse(), now=now))[0] for _ in range(3)]
    rerun_changed = LedgerEntry.objects.count() != entries
    later = now + timedelta(minutes=5)
    next_ms, _ = timed(lambda: accounting_reconcile(records=parse(), now=later))
    inconsistent = CreditAccount.objects.inconsistent().count()
    return {
        "jobs": args.jobs,
        "running": args.running,
        "baseline_parse_ms": round(baseline, 1),
        "first_ms": round(first_ms, 1),
        "rerun_ms": round(statistics.median(reruns), 1),
        "next_window_ms": round(next_ms, 1),
        "first_charged": first.charged,
        "unknown_users": len(first.unknown_users),
        "ledger_entries": entries,
        "rerun_changed_ledger": rerun_changed,
        "inconsistent_accounts": inconsistent,
    }


if __name__ == "__main__":
    sys.exit(main())

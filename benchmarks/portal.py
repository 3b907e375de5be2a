"""`make bench`: each LabPortal target with its anchor measured in the same run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/labportal \\
    CELERY_BROKER_URL=redis://127.0.0.1:6379/0 python -m benchmarks.portal [--json] \\
        [--only submit,arrays,start,makespan,load]

(`--only arrays`: just the job arrays of 50 and 1,000 and their `sbatch --array` anchor.)

It creates (and afterwards drops) a database `<name>_bench` next to the one in
DATABASE_URL and serves the portal with gunicorn (production settings). When
Slurm is installed it first starts a private one (benchmarks.local_slurm: one
node, Gres=gpu:4) and runs the same workloads on it; otherwise every Slurm
column says "not measured". Then, for the portal:

- API submits per second (POST /api/jobs/), 1 client and 8 clients, and in
  batches of 50 (POST /api/jobs/batch/); anchors: `sbatch --hold` at 1 and 8 clients,
  and held `sbatch --array` of 50 for the batches;
- submit → running on an idle cluster (control worker with beat, one agent with
  4 simulated GPUs and the local-process runtime): p50/p95/max; anchor: sbatch;
- makespan of 500 × `sleep 1`, 1 GPU each, on those 4 GPUs, against the ideal
  (jobs × length / 4) and a Slurm job array; jobs that did not complete are counted;
- a big lab's database (benchmarks.portal_load): a scheduling pass with 2,000
  waiting, each page's CPU cost and SQL count, pages under 20 concurrent clients,
  and telemetry ingest against a bare bulk insert of the same rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests

GPUS = 4  # the issue's setup: one simulated node with 4 GPUs
BATCH = 50  # jobs per POST /api/jobs/batch/, like a job array
# Job arrays (POST /api/jobs/array/) against held `sbatch --array` of the same size.
ARRAY_SIZES = (50, 1000)


def arrays_of(size: int, serial: int) -> int:
    """How many arrays of ``size`` a run submits: ``serial`` jobs' worth, at least 3."""
    return max(3, serial // size)


PARTS = ("submit", "start", "makespan", "load")
# Parts that only `--only` names: a subset of one of PARTS, measured alone.
SUBSETS = {"arrays": "submit"}  # the job-array figures of "submit" (and their sbatch anchor)


def bench_database_url(url: str, suffix: str = "bench") -> tuple[str, str, str]:
    """A bench's own database next to `url`'s: (its URL, the admin URL, its name)."""
    parts = urlsplit(url)
    name = parts.path.lstrip("/") + "_" + suffix
    admin = urlunsplit(parts._replace(path="/postgres"))
    return urlunsplit(parts._replace(path="/" + name)), admin, name


def production_settings_environment(prefix: str, **extra: str) -> str:
    """Environment for a bench that measures production settings (not the demo's DEBUG).

    A private var dir (returned), a throwaway secret key, quiet logs; `extra` overrides.
    """
    var_dir = tempfile.mkdtemp(prefix=f"labportal-{prefix}-")
    os.environ.update(
        {
            "LABPORTAL_VAR_DIR": var_dir,
            "DEBUG": "false",
            # The benchmark measures the portal's capacity, not its rate limits.
            "LABPORTAL_API_RATE": "off",
            "LABPORTAL_API_RATE_SUBMIT": "off",
            "SECRET_KEY": "labportal-bench-" + os.urandom(16).hex(),
            "ALLOWED_HOSTS": "localhost",
            "LOG_LEVEL": "ERROR",
            **extra,
        }
    )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "labportal.settings")
    return var_dir


def recreate_database(admin_url: str, name: str, drop_only: bool = False) -> None:
    import psycopg

    with psycopg.connect(
        admin_url.replace("postgres://", "postgresql://", 1), autocommit=True
    ) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not drop_only:
            conn.execute(f'CREATE DATABASE "{name}"')


@contextmanager
def migrated_bench_database(url: str, suffix: str) -> Iterator[None]:
    """Django set up on a bench's own database next to `url`'s, migrated, dropped after."""
    bench_url, admin_url, name = bench_database_url(url, suffix)
    recreate_database(admin_url, name)
    os.environ["DATABASE_URL"] = bench_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "labportal.settings")
    import logging

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    logging.disable(logging.INFO)
    try:
        call_command("migrate", verbosity=0)
        yield
    finally:
        connections.close_all()
        recreate_database(admin_url, name, drop_only=True)


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


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) used so far by the live processes of a process group.

    The web server's gunicorn master and workers share one group (devstack starts
    each service in a session of its own). Unlike a rate, this does not depend on
    what else the machine runs.
    """
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        # After the command's name: state, ppid, pgrp, ... utime (12th), stime (13th).
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def timed_cpu(pgid: int, count: int, run: Any) -> tuple[float, float]:
    """(calls per second, the server's CPU ms per call) of `run()` making `count` calls."""
    before = group_cpu_s(pgid)
    rate = float(run())
    return rate, (group_cpu_s(pgid) - before) * 1000 / count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--serial", type=int, default=300, help="submits one at a time")
    parser.add_argument("--parallel", type=int, default=800, help="submits with 8 clients")
    parser.add_argument("--starts", type=int, default=30, help="jobs for the time-to-start figure")
    parser.add_argument("--makespan-jobs", type=int, default=500, help="1-GPU jobs on 4 GPUs")
    parser.add_argument("--makespan-seconds", type=float, default=1.0, help="each job's length")
    parser.add_argument(
        "--page-rates",
        default="5,10,20",
        help="open-loop page loads, requests/s (comma-separated); the last is the goal's",
    )
    parser.add_argument("--page-seconds", type=float, default=60.0, help="each open-loop rate")
    parser.add_argument(
        "--saturation-rates",
        default="20,30,40,50,60,80,100",
        help="rising open-loop rates until the p95 over all pages passes 1 s",
    )
    parser.add_argument("--saturation-seconds", type=float, default=20.0)
    parser.add_argument("--finished-jobs", type=int, default=100_000, help="big database")
    parser.add_argument("--samples", type=int, default=1_000_000, help="big database")
    parser.add_argument("--web-workers", type=int, default=3)
    parser.add_argument("--no-slurm", action="store_true", help="skip the Slurm anchor")
    parser.add_argument(
        "--slurm-ports",
        default="8801,8802",
        help="slurmctld,slurmd ports of the private Slurm (two free ports)",
    )
    parser.add_argument(
        "--only",
        default=",".join(PARTS),
        help=f"comma-separated parts to measure, of {','.join(PARTS)} (default: all), or "
        "arrays (only the job-array figures of submit, with their sbatch --array anchor)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    args.parts = {p.strip() for p in args.only.split(",") if p.strip()}
    unknown = args.parts - set(PARTS) - set(SUBSETS)
    if unknown:
        parser.error(
            f"unknown part(s) {', '.join(sorted(unknown))}; choose from "
            f"{', '.join([*PARTS, *SUBSETS])}"
        )
    # "submit" measures its subsets too; a subset alone measures only itself.
    args.parts |= {sub for sub, part in SUBSETS.items() if part in args.parts}

    source = os.environ.get("DATABASE_URL", "")
    if not source.startswith("postgres"):
        print(
            "benchmarks.portal needs PostgreSQL: set DATABASE_URL=postgres://… (it creates its own _bench database).",
            file=sys.stderr,
        )
        return 2
    results: dict[str, Any] = {"slurm": _slurm_anchor(args)}
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
            "ALLOWED_HOSTS": "127.0.0.1,localhost,testserver",
            "LABPORTAL_ALLOW_SIMULATION": "true",
            "LOG_LEVEL": "WARNING",
            # The benchmark measures the portal's capacity, not its rate limits.
            "LABPORTAL_API_RATE": "off",
            "LABPORTAL_API_RATE_SUBMIT": "off",
        }
    )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "labportal.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from benchmarks import portal_load
    from labportal.devstack import Stack, free_port, wait_for_port

    call_command("migrate", verbosity=0)
    call_command("collectstatic", interactive=False, verbosity=0)  # DEBUG=false serves hashed names
    token, node_tokens = _seed()
    stack = Stack(env={**os.environ, "PYTHONUNBUFFERED": "1"}, log_dir=var_dir / "logs")
    portal: dict[str, Any] = {}
    results["labportal"] = portal
    try:
        port = free_port()
        web = stack.web(port, workers=args.web_workers)
        wait_for_port(port, timeout_s=120)  # a loaded machine starts gunicorn slowly
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
        # Warm up every worker and thread (a session keeps its connection, so its
        # worker): the first requests import and set up what a cold worker lacks.
        timed_requests(session, 48, 8, read)
        timed_requests(session, 24, 8, submit)
        if "submit" in args.parts:
            rate, cpu = timed_cpu(
                web.pid, args.serial, lambda: timed_requests(session, args.serial, 1, read)
            )
            portal["read_serial_per_s"], portal["read_server_cpu_ms"] = (
                round(rate, 1),
                round(cpu, 2),
            )
            rate, cpu = timed_cpu(
                web.pid, args.serial, lambda: timed_requests(session, args.serial, 1, submit)
            )
            portal["submit_serial_per_s"], portal["submit_server_cpu_ms"] = (
                round(rate, 1),
                round(cpu, 2),
            )
            rate, cpu = timed_cpu(
                web.pid, args.parallel, lambda: timed_requests(session, args.parallel, 8, submit)
            )
            portal["submit_parallel8_per_s"], portal["submit_parallel8_server_cpu_ms"] = (
                round(rate, 1),
                round(cpu, 2),
            )
            batch = {"jobs": [payload] * BATCH}
            submit_batch = lambda s: s.post(f"{base}/api/jobs/batch/", json=batch)  # noqa: E731
            batches = max(1, args.serial // BATCH)
            portal["submit_batch_jobs_per_s"] = round(
                timed_requests(session, batches, 1, submit_batch) * BATCH, 1
            )
        if "arrays" in args.parts:
            for size in ARRAY_SIZES:
                array: dict[str, Any] = {**payload, "array": f"0-{size - 1}"}
                submit_array = lambda s, a=array: s.post(f"{base}/api/jobs/array/", json=a)  # noqa: E731
                count = arrays_of(size, args.serial)
                # One untimed array first, on the connection (so the worker) the timed ones
                # use: a worker's first array pays one-off costs (a worker the warm-up
                # missed: its first request, ~2 s of CPU) that are no array's.
                warm = session()
                warm.post(f"{base}/api/jobs/array/", json=array).raise_for_status()
                rate, cpu = timed_cpu(
                    web.pid,
                    count,
                    lambda f=submit_array, n=count, w=warm: timed_requests(lambda: w, n, 1, f),
                )
                portal[f"submit_array{size}_jobs_per_s"] = round(rate * size, 1)
                portal[f"submit_array{size}_server_cpu_ms"] = round(cpu, 2)
        if args.parts & {"start", "makespan"}:
            _start_agent(stack, node_tokens, settings, var_dir)
        if "start" in args.parts:
            portal["time_to_start"] = _time_to_start(stack, base, session, args.starts)
        if "makespan" in args.parts:
            portal["makespan"] = _makespan(stack, base, session, args)
        stack.stop()
        stack = Stack(env={**os.environ, "PYTHONUNBUFFERED": "1"}, log_dir=var_dir / "logs2")
        if "load" not in args.parts:
            return _report(results, args)

        began = time.perf_counter()
        lab = portal_load.big_lab(finished=args.finished_jobs, samples=args.samples)
        portal["big_database_s"] = round(time.perf_counter() - began, 1)
        portal["pass"] = portal_load.pass_times()
        portal["page_cost"] = portal_load.page_costs(lab["members"])
        port = free_port()
        stack.web(port, workers=args.web_workers)
        wait_for_port(port)
        portal["pages_open_loop"] = portal_load.open_loop_pages(
            f"http://127.0.0.1:{port}",
            lab["members"],
            rates=_rates(args.page_rates),
            seconds=args.page_seconds,
            saturation_rates=_rates(args.saturation_rates),
            saturation_seconds=args.saturation_seconds,
        )
        portal["ingest"] = portal_load.ingest_rates()
    finally:
        stack.stop()
        from django.db import connections

        connections.close_all()
        recreate_database(admin_url, bench_name, drop_only=True)
    return _report(results, args)


def _rates(text: str) -> list[float]:
    return [float(r) for r in text.split(",") if r.strip()]


def _report(results: dict[str, Any], args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps(results, default=str))
    else:
        _print_report(results, args)
    return 0


def _slurm_anchor(args: argparse.Namespace) -> dict[str, Any]:
    """The same workloads on a private Slurm, or why it was not measured."""
    from benchmarks.local_slurm import LocalSlurm, summary

    missing = "skipped with --no-slurm" if args.no_slurm else LocalSlurm.missing()
    if missing:
        return {"not_measured": missing}
    if not args.parts & {"submit", "arrays", "start", "makespan"}:
        return {"not_measured": "no part that Slurm runs was asked for"}
    ctld, slurmd = (int(p) for p in args.slurm_ports.split(","))
    slurm = LocalSlurm(gpus=4, ports=(ctld, slurmd))
    try:
        slurm.start()
        out: dict[str, Any] = {}
        if "submit" in args.parts:
            out["sbatch_serial_per_s"] = round(slurm.submit_rate(min(args.serial, 300), 1), 1)
            out["sbatch_parallel8_per_s"] = round(slurm.submit_rate(min(args.parallel, 800), 8), 1)
        if "arrays" in args.parts:
            for size in ARRAY_SIZES:
                out[f"sbatch_array{size}_jobs_per_s"] = round(
                    slurm.array_submit_rate(arrays_of(size, args.serial), size), 1
                )
        if "start" in args.parts:
            out["time_to_start"] = summary(slurm.submit_to_running(args.starts))
        if "makespan" in args.parts:
            out["makespan"] = slurm.makespan(args.makespan_jobs, args.makespan_seconds)
            out["makespan"]["makespan_s"] = round(out["makespan"]["makespan_s"], 1)
        return out
    except Exception as exc:  # report it, and measure the portal anyway
        return {"not_measured": f"Slurm failed in this run: {exc}"}
    finally:
        slurm.stop()


def _fmt(value: Any, unit: str = "") -> str:
    return "not measured" if value is None else f"{value}{unit}"


def _print_report(results: dict[str, Any], args: argparse.Namespace) -> None:
    lp, sl = results["labportal"], results["slurm"]
    gone = sl.get("not_measured")
    if gone:
        print(f"Slurm anchor: not measured ({gone})")

    def slurm(*keys: str) -> Any:
        value: Any = sl
        for key in keys:
            if not isinstance(value, dict) or key not in value:
                return None
            value = value[key]
        return value

    rows: list[tuple[str, str, str, str]] = []
    if "makespan" in lp:
        rows += _makespan_rows(lp, slurm, args)
    if "time_to_start" in lp:
        tts, stts = lp["time_to_start"], slurm("time_to_start")
        rows.append(
            (
                "submit to running p50/p95/max",
                f"{tts['p50_s']}/{tts['p95_s']}/{tts['max_s']} s",
                _fmt(stts and f"{stts['p50_s']}/{stts['p95_s']}/{stts['max_s']} s"),
                "p95 < 1 s, max < 2 s",
            )
        )
    if "submit_serial_per_s" in lp:
        rows += _submit_rows(lp, slurm)
    else:  # --only arrays
        rows += _array_rows(lp, slurm)
    if "pass" in lp:
        rows += _load_rows(lp, args)
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    header = ("target", "LabPortal", "anchor (same run)", "goal")
    for row in [header, *rows]:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    if "big_database_s" in lp:
        print(f"(big database generated in {lp['big_database_s']} s)")


def _makespan_rows(lp: dict[str, Any], slurm: Any, args: argparse.Namespace) -> list[Any]:
    ideal = args.makespan_jobs * args.makespan_seconds / 4
    ms = lp["makespan"]
    sms = slurm("makespan", "makespan_s")
    gap = ms["gap"]
    return [
        (
            f"{args.makespan_jobs}x{args.makespan_seconds:g}s on 4 GPUs, makespan",
            f"{ms['makespan_s']} s = {ms['makespan_s'] / ideal:.2f}x ideal",
            _fmt(sms and f"{sms} s = {sms / ideal:.2f}x ideal"),
            f"<=1.1x ideal, <=0.7x Slurm ({'%.2f' % (ms['makespan_s'] / sms) if sms else '?'}x)",
        ),
        ("  jobs wrongly failed", str(ms["failed"]), "", "0"),
        (
            "  GPU idle between jobs p50/p95",
            f"{gap['idle_p50_s']}/{gap['idle_p95_s']} s",
            f"end→dispatch p50 {gap['end_to_dispatch_p50_s']} s, "
            f"dispatch→start p50 {gap['dispatch_to_start_p50_s']} s",
            "",
        ),
    ]


def _submit_rows(lp: dict[str, Any], slurm: Any) -> list[Any]:
    rows = []
    for label, key, skey in (
        ("API submits/s, 1 client", "submit_serial_per_s", "sbatch_serial_per_s"),
        ("API submits/s, 8 clients", "submit_parallel8_per_s", "sbatch_parallel8_per_s"),
    ):
        anchor = slurm(skey)
        rows.append(
            (
                label,
                f"{lp[key]}/s",
                _fmt(anchor and f"{anchor}/s (sbatch)"),
                f">=1.5x sbatch ({'%.2f' % (lp[key] / anchor) if anchor else '?'}x)",
            )
        )
    array = slurm(f"sbatch_array{BATCH}_jobs_per_s")
    batch = lp["submit_batch_jobs_per_s"]
    rows.append(
        (
            f"API submits/s, batches of {BATCH}, 1 client",
            f"{batch}/s",
            _fmt(array and f"{array}/s (sbatch --array of {BATCH})"),
            f"({'%.2f' % (batch / array) if array else '?'}x)",
        )
    )
    rows += _array_rows(lp, slurm)
    rows.append(("authenticated read/s, 1 client", f"{lp['read_serial_per_s']}/s", "", ""))
    # Rates on a busy machine vary with its other work; the web server's own CPU per
    # request does not (the database's CPU is not included).
    rows.append(("web server CPU per submit, 1 client", f"{lp['submit_server_cpu_ms']} ms", "", ""))
    rows.append(
        (
            "web server CPU per submit, 8 clients",
            f"{lp['submit_parallel8_server_cpu_ms']} ms",
            "",
            "",
        )
    )
    rows.append(
        ("web server CPU per read (GET /api/queues/)", f"{lp['read_server_cpu_ms']} ms", "", "")
    )
    return rows


def _array_rows(lp: dict[str, Any], slurm: Any) -> list[Any]:
    rows = []
    for size in ARRAY_SIZES:
        if f"submit_array{size}_jobs_per_s" not in lp:
            continue
        array = slurm(f"sbatch_array{size}_jobs_per_s")
        ours = lp[f"submit_array{size}_jobs_per_s"]
        rows.append(
            (
                f"job arrays of {size}, jobs/s, 1 client",
                f"{ours}/s ({lp[f'submit_array{size}_server_cpu_ms']} ms web CPU per array)",
                _fmt(array and f"{array}/s (sbatch --array of {size})"),
                f">=1x sbatch --array ({'%.2f' % (ours / array) if array else '?'}x)",
            )
        )
    return rows


def _load_rows(lp: dict[str, Any], args: argparse.Namespace) -> list[Any]:
    rows = []
    p = lp["pass"]
    rows.append(
        (
            f"scheduling pass, {p['waiting']} waiting",
            f"{p['pass_median_ms']} ms (max {p['pass_max_ms']})",
            f"cpu {p.get('pass_cpu_median_ms')} ms, load {p.get('load_average')}",
            "< 300 ms",
        )
    )
    load = lp["pages_open_loop"]
    rates = list(load["rates"])
    for rate in rates:
        every = load["rates"][rate]["all"]
        worst = max(load["rates"][rate]["pages"].items(), key=lambda kv: kv[1]["p95_ms"])
        rows.append(
            (
                f"pages, open loop {rate:g} req/s, {args.page_seconds:g} s",
                f"p50 {every['p50_ms']} / p95 {every['p95_ms']} / p99 {every['p99_ms']} ms",
                f"worst p95: {worst[0]} {worst[1]['p95_ms']} ms"
                f" (generator lag max {every['dispatch_lag_max_ms']} ms)",
                "p95 <= 150 ms each" if rate == rates[-1] else "",
            )
        )
    sat = load["saturation"]
    rows.append(
        (
            "pages, saturation (open loop, p95 over all pages)",
            f"p95 <= 1 s up to {sat['held_per_s']} req/s"
            + (f", over at {sat['passed_at_per_s']}" if sat["passed_at_per_s"] else ""),
            ", ".join(f"{st['rate']:g}/s: {st['p95_ms']} ms" for st in sat["steps"]),
            "printed",
        )
    )
    goal_rate = load["rates"][rates[-1]]["pages"]
    for name, cost in lp["page_cost"].items():
        lat = goal_rate.get(name, {})
        rows.append(
            (
                f"  {name}",
                f"at {rates[-1]:g}/s: p50 {lat.get('p50_ms')} / p95 {lat.get('p95_ms')} ms",
                f"cpu min {cost['cpu_min_ms']} / median {cost['cpu_ms']} ms,"
                f" {cost['queries']} SQL, {cost['kb']} KB ({cost['wire_kb']} KB sent)",
                "cpu <= 30 ms",
            )
        )
    ing = lp["ingest"]
    rows.append(
        (
            "telemetry ingest (PostgreSQL)",
            f"{ing['ingest_samples_per_s']} samples/s",
            f"bare bulk insert {ing['bulk_insert_samples_per_s']}/s",
            ">= 9000/s",
        )
    )
    return rows


def seed_member() -> str:
    """The benches' member (a category with room for every job) and the demo image;
    returns the member's API token."""
    from accounts.models import Category, PersonalAccessToken, User
    from jobqueue.models import ContainerImage

    category = Category.objects.create(
        name="Bench", max_queued_jobs=100_000, max_concurrent_gpus=64
    )
    user = User.objects.create_user(
        "bench", "bench@lab.example", "bench-password", category=category
    )
    _pat, secret = PersonalAccessToken.issue(user=user, name="bench")
    ContainerImage.objects.create(reference="labportal/demo:local")
    return secret


def _seed() -> tuple[str, list[tuple[str, str]]]:
    from cluster.models import NodeToken

    secret = seed_member()
    from agent.gpu.simulated import simulated_gpu_uuid
    from cluster.models import Gpu, Node

    nodes = []
    for name in ("bench-node-1",):
        _token, node_secret = NodeToken.issue(node_name=name)
        nodes.append((name, node_secret))
        # The GPUs the simulated agent will register, so submits are accepted before it starts.
        node = Node.objects.create(name=name, state=Node.State.UP)
        for index in range(GPUS):
            Gpu.objects.create(
                node=node,
                index=index,
                uuid=simulated_gpu_uuid(name, index),
                model="Simulated A100 80GB",
                memory_mb=81920,
            )
    return secret, nodes


def _start_agent(
    stack: Any, node_tokens: list[tuple[str, str]], settings: Any, var_dir: Path
) -> None:
    from cluster.models import Node
    from jobqueue.models import Job

    # The throughput runs left thousands of jobs waiting; the rest is measured on a free cluster.
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
            gpus=GPUS,
            state_dir=var_dir / name,
        )
    deadline = time.monotonic() + 90
    while not Node.objects.filter(name=node_tokens[0][0]).exclude(agent_version="").exists():
        stack.check_alive()
        if time.monotonic() > deadline:
            raise SystemExit(
                "the bench agent did not register in 90 s:\n"
                + stack.tail(f"agent-{node_tokens[0][0]}")
            )
        time.sleep(0.5)


def _time_to_start(stack: Any, base: str, session: Any, count: int) -> dict[str, Any]:
    """Submit → running, one job at a time on an idle cluster (the job's own start time)."""
    from jobqueue.models import Job

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
            time.sleep(0.02)
    from benchmarks.local_slurm import summary

    time.sleep(1)  # let the last one end: the next figure starts on an idle cluster
    return {**summary(waits), "jobs": len(waits)}


def _makespan(stack: Any, base: str, session: Any, args: argparse.Namespace) -> dict[str, Any]:
    """``--makespan-jobs`` 1-GPU jobs of ``sleep`` submitted as job arrays: first submit to last end."""
    from django.db.models import Max

    from jobqueue.models import Job

    payload = {
        "image": "labportal/demo:local",
        "command": ["sleep", f"{args.makespan_seconds:g}"],
        "gpus": 1,
        "time_limit_s": 600,
    }
    s = session()
    first = Job.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    began = time.time()
    left = args.makespan_jobs
    while left:
        n = min(BATCH, left)
        response = s.post(f"{base}/api/jobs/batch/", json={"jobs": [payload] * n})
        if response.status_code >= 300:
            raise SystemExit(f"batch submit failed: {response.status_code} {response.text[:200]}")
        left -= n
    ours = Job.objects.filter(pk__gt=first)
    deadline = time.monotonic() + args.makespan_jobs * args.makespan_seconds * 5 + 120
    while ours.filter(state__in=[*Job.WAITING_STATES, *Job.ACTIVE_STATES]).exists():
        stack.check_alive()
        if time.monotonic() > deadline:
            raise SystemExit(f"the makespan jobs did not end in time:\n{stack.tail('control')}")
        time.sleep(0.25)
    last_end = ours.aggregate(m=Max("ended_at"))["m"]
    failed = ours.exclude(state=Job.State.COMPLETED).count()
    return {
        "makespan_s": round(last_end.timestamp() - began, 1),
        "jobs": ours.count(),
        "failed": failed,
        "gap": _idle_gaps(first),
    }


def _idle_gaps(first_pk: int) -> dict[str, float | None]:
    """Where a GPU's idle time between one job's end and the next one's start goes.

    end → dispatch: the exit's way to the portal, the pass request and the pass up to its
    plan (dispatched_at is the pass's clock); dispatch → start: the rest of the pass, the
    start command's way to the agent and the process's launch (started_at is the agent's).
    """
    from jobqueue.models import Allocation

    runs: dict[int, list[tuple[float, float, float]]] = {}
    for gpu_id, dispatched_at, started_at, ended_at in Allocation.objects.filter(
        job__pk__gt=first_pk,
        job__dispatched_at__isnull=False,
        job__started_at__isnull=False,
        job__ended_at__isnull=False,
    ).values_list("gpu_id", "job__dispatched_at", "job__started_at", "job__ended_at"):
        assert dispatched_at and started_at and ended_at  # filtered above
        runs.setdefault(gpu_id, []).append(
            (started_at.timestamp(), dispatched_at.timestamp(), ended_at.timestamp())
        )
    idle: list[float] = []
    to_dispatch: list[float] = []
    to_start: list[float] = []
    for seq in runs.values():
        seq.sort()
        for (_s0, _d0, end), (start, dispatch, _e1) in zip(seq, seq[1:], strict=False):
            idle.append(start - end)
            to_dispatch.append(dispatch - end)
            to_start.append(start - dispatch)

    def q(values: list[float], at: float) -> float | None:
        return round(percentile(values, at), 3) if values else None

    return {
        "idle_p50_s": q(idle, 0.5),
        "idle_p95_s": q(idle, 0.95),
        "end_to_dispatch_p50_s": q(to_dispatch, 0.5),
        "dispatch_to_start_p50_s": q(to_start, 0.5),
    }


if __name__ == "__main__":
    sys.exit(main())

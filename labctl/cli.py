"""labctl: submit, watch and cancel jobs, book GPUs and check credits from a terminal.

Exit codes: 0 ok, 1 the portal refused (its message says how to fix it), 2 usage or
configuration error, 3 the portal cannot be reached.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from labctl import __version__, config, files
from labctl.client import Client
from labctl.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    ApiRefusal,
    LabctlError,
    UsageError,
)
from labctl.limits import command_limit_refusal
from labctl.output import dump_json, parse_iso, span, table, when
from labctl.parsing import (
    argtype,
    array_text,
    parse_array,
    parse_count,
    parse_dependency,
    parse_duration,
    parse_env,
    parse_hours,
    parse_size_mb,
    parse_when,
)

FINAL_JOB_STATES = {"completed", "failed", "cancelled", "timed_out", "lost"}
FOLLOW_INTERVAL_S = 2.0

Handler = Callable[[argparse.Namespace, Client], Any]


# --- argument parser ---------------------------------------------------------------------------


def _global_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """--json/--url/--token work before or after the subcommand."""
    default: Any = argparse.SUPPRESS if suppress else None
    parser.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="print the raw JSON the portal returned (for scripts)",
    )
    parser.add_argument(
        "--url", default=default, help="portal URL (overrides LABPORTAL_URL and the config file)"
    )
    parser.add_argument(
        "--token",
        default=default,
        help="API token lp_... (overrides LABPORTAL_TOKEN and the config file)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="labctl",
        description="The LabPortal command line: jobs, queues, GPU bookings and credits.",
        epilog="Exit codes: 0 ok, 1 refused by the portal, 2 usage/config error, 3 portal unreachable. "
        "Docs: docs/labctl.md",
    )
    parser.add_argument("--version", action="version", version=f"labctl {__version__}")
    _global_options(parser, suppress=False)
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, suppress=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help_text, description=help_text)
        p.set_defaults(handler=handler)
        return p

    p = add("login", cmd_login, "store the portal URL and your API token")
    p.add_argument(
        "--no-verify", action="store_true", help="store without checking the token with the portal"
    )

    p = add(
        "submit", cmd_submit, "submit a job: labctl submit --image IMG [options] -- command args..."
    )
    p.add_argument("--image", required=True, help="container image from the lab's allowlist")
    p.add_argument("--queue", help="queue name (default: normal)")
    _size_options(p)
    p.add_argument("--shared-slot", action="store_true", help="one shared GPU slot (debug queue)")
    p.add_argument(
        "--env",
        action="append",
        type=argtype(parse_env),
        default=[],
        metavar="KEY=VALUE",
        help="environment variable (repeatable)",
    )
    p.add_argument(
        "--mount",
        action="append",
        default=[],
        metavar="NAME",
        help="an allowlisted volume by name (repeatable)",
    )
    p.add_argument("--gpu-model", help="GPU model, e.g. A100")
    p.add_argument(
        "--min-gpu-memory",
        type=argtype(parse_size_mb),
        metavar="SIZE",
        help="minimum memory per GPU: 40G, 24GiB, 16384M",
    )
    p.add_argument("--cpus", type=float, help="CPU cores (default 4)")
    p.add_argument(
        "--memory", type=argtype(parse_size_mb), metavar="SIZE", help="RAM: 16G, 512M (default 16G)"
    )
    p.add_argument("--name", help="a name for the job")
    p.add_argument(
        "--array",
        type=argtype(parse_array),
        metavar="RANGE",
        help="a job array: 0-9 or 1,4,7; each job gets LABPORTAL_ARRAY_INDEX (all queued or none)",
    )
    p.add_argument("--reservation", type=int, metavar="ID", help="run inside your booking ID")
    p.add_argument(
        "--project",
        metavar="NAME",
        help="charge the GPU time to your project NAME (a grant, a shared project) in the "
        "usage report, as Slurm's --account",
    )
    p.add_argument(
        "--dependency",
        "-d",
        type=argtype(parse_dependency),
        metavar="afterok:ID[:ID…]",
        help="start only after other jobs of yours: afterok:12:13 (each completed) or "
        "afterany:12 (ended, however), as Slurm's --dependency",
    )
    p.add_argument(
        "--preemptible",
        action="store_true",
        help="may be stopped and requeued for an emergency or a reservation (same rate)",
    )
    p.add_argument("argv", nargs="*", metavar="-- COMMAND", help="the command to run, after --")

    p = add("status", cmd_status, "your jobs, or one job's details and events")
    p.add_argument("job_id", nargs="?", type=int, metavar="JOB_ID")
    p.add_argument("--all", action="store_true", help="include finished jobs")
    p.add_argument("--state", help="only these states, e.g. pending,running")
    p.add_argument("--queue", help="only this queue")
    p.add_argument(
        "--limit", type=argtype(parse_count), default=50, help="at most this many jobs (default 50)"
    )

    add(
        "queue",
        cmd_queue,
        "the queue: every waiting job with position and estimated start, every running job",
    )

    p = add("cancel", cmd_cancel, "cancel jobs")
    p.add_argument("job_ids", nargs="+", type=int, metavar="JOB_ID")
    p.add_argument(
        "--array",
        action="store_true",
        help="cancel every job of the array each JOB_ID belongs to that has not ended",
    )

    p = add(
        "session",
        cmd_session,
        "interactive sessions: session start --kind jupyter --image IMG | list | open ID | stop ID",
    )
    p.add_argument("action", choices=["start", "list", "open", "stop"])
    p.add_argument("session_id", nargs="?", type=int, metavar="ID", help="for open and stop")
    p.add_argument("--kind", choices=["jupyter", "terminal"], default="jupyter")
    p.add_argument("--image", help="container image from the lab's allowlist (start)")
    p.add_argument("--queue", help="queue name (default: debug)")
    _size_options(p)
    p.add_argument("--reservation", type=int, metavar="ID", help="run inside your booking ID")

    p = add("logs", cmd_logs, "a job's whole log output (-f: follow it until the job ends)")
    p.add_argument("job_id", type=int, metavar="JOB_ID")
    p.add_argument(
        "--tail", type=int, metavar="N", help="only the last N lines (then new ones with -f)"
    )
    p.add_argument(
        "--refresh",
        action="store_true",
        help="ask the node for a fresh tail first (jobs on agents of an earlier release)",
    )
    p.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help=f"poll every {FOLLOW_INTERVAL_S:g} s and print new output until the job ends (Ctrl-C stops)",
    )

    p = add(
        "book",
        cmd_book,
        "book GPUs: labctl book --gpus N --start TIME --hours H; or labctl book cancel|release|extend ID",
    )
    p.add_argument(
        "action",
        nargs="?",
        choices=["cancel", "release", "extend"],
        help="cancel a future booking, release an active one early, or extend one",
    )
    p.add_argument(
        "reservation_id",
        nargs="?",
        type=int,
        metavar="ID",
        help="the booking, for cancel|release|extend",
    )
    p.add_argument("--gpus", type=int, help="number of whole GPUs")
    p.add_argument(
        "--node", help="node name; without it labctl books the first node free at that time"
    )
    p.add_argument(
        "--start",
        type=argtype(parse_when),
        help='"2026-12-01 14:00", ISO 8601, "tomorrow 9:30" (local time)',
    )
    p.add_argument(
        "--hours",
        type=argtype(parse_hours),
        help="length (book) or extra hours (extend): 2, 1.5, 90m",
    )
    p.add_argument("--until", type=argtype(parse_when), help="extend: the new end time")
    p.add_argument("--note", default="", help="a note shown on the calendar")

    p = add("bookings", cmd_bookings, "your GPU bookings")
    p.add_argument(
        "--all", action="store_true", help="include past, cancelled and released bookings"
    )
    p.add_argument("--state", choices=["booked", "active", "completed", "released", "cancelled"])

    p = add("suggest", cmd_suggest, "the earliest free slot for N GPUs for H hours")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--hours", type=argtype(parse_hours), required=True)
    p.add_argument("--node", help="only this node")
    p.add_argument("--after", type=argtype(parse_when), help="not before this time")

    p = add("files", cmd_files, "files in your volumes and job folders: labctl files ls [PLACE]")
    p.add_argument("action", choices=["ls"], help="ls: list your volumes, or a folder")
    p.add_argument("target", nargs="?", help="volume:NAME[/PATH] or job:ID[/PATH]")
    p = add(
        "cp", cmd_cp, "copy a file: labctl cp job:123/out.txt ./  or  labctl cp f.py volume:home/"
    )
    p.add_argument("source", help="a local file, or volume:NAME/PATH / job:ID/PATH")
    p.add_argument("destination", help="a local path, or volume:NAME/FOLDER/ / job:ID/FOLDER/")
    p.add_argument("--overwrite", action="store_true", help="replace a file of the same name")
    p = add("credits", cmd_credits, "your credit balance, burn rate and latest ledger entries")
    p.add_argument("--entries", type=int, default=10, help="how many ledger entries (default 10)")
    return parser


# --- entry point -------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as stop:  # argparse: --help (0) or a usage error (2), message already printed
        return int(stop.code or 0)
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        if args.handler is cmd_login:
            return cmd_login(args, None)
        settings = config.resolve(args.url, args.token)
        result = args.handler(args, Client(settings.url, settings.token))
        sys.stdout.flush()  # here, so a closed pipe is met inside this try, not at exit
        return EXIT_OK if result is None else int(result)
    except LabctlError as error:
        _fail(error)
        return error.exit_code
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `labctl jobs | head`: the reader stopped reading. Quietly, as a Unix tool does:
        # the rest goes nowhere (Python would otherwise report the pipe again at exit).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _fail(error: LabctlError) -> None:
    prefix = "labctl: " if isinstance(error, UsageError) else "error: "
    print(prefix + error.message, file=sys.stderr)
    if isinstance(error, ApiRefusal):
        suggestion = error.body.get("suggestion") if isinstance(error.body, dict) else None
        if isinstance(suggestion, dict):
            print("Nearest free slot: " + _slot_line(suggestion), file=sys.stderr)
            print("  book it: " + _book_command(suggestion), file=sys.stderr)
        if error.status == 401:
            print(
                "Then store the new token with `labctl login --token lp_...` (tokens: /account/tokens/).",
                file=sys.stderr,
            )


# --- files ---------------------------------------------------------------------------------------


def cmd_files(args: argparse.Namespace, client: Client) -> int:
    return files.cmd_files_ls(client, args.target, bool(args.json))


def cmd_cp(args: argparse.Namespace, client: Client) -> int:
    return files.cmd_cp(client, args.source, args.destination, args.overwrite)


# --- login ---------------------------------------------------------------------------------------


def cmd_login(args: argparse.Namespace, _client: Client | None) -> int:
    stored = config.read_file()
    url = args.url or stored.get("url")
    if not url:
        raise UsageError(
            "Give the portal URL: labctl login --url http://portal:8000 --token lp_..."
        )
    url = config.normalise_url(url)
    token = args.token
    if not token:
        if not sys.stdin.isatty():
            token = sys.stdin.readline().strip()
        else:
            token = getpass.getpass(f"API token (create one at {url}{config.TOKEN_PAGE}): ").strip()
    if not token:
        raise UsageError(
            f"Give the token with --token lp_...; create one at {url}{config.TOKEN_PAGE}."
        )
    who = None
    if not args.no_verify:
        who = Client(url, token).get("/api/v1/credits/").get("username")
    path = config.write_file(url, token)
    if args.json:
        dump_json({"url": url, "username": who, "config": str(path)})
    else:
        print(f"Logged in to {url}" + (f" as {who}" if who else "") + f"; saved to {path}.")
    return EXIT_OK


# --- jobs ----------------------------------------------------------------------------------------


def cmd_submit(args: argparse.Namespace, client: Client) -> int:
    if not args.argv:
        raise UsageError(
            "Give the command to run after --, e.g. labctl submit --image IMG -- python train.py"
        )
    refusal = command_limit_refusal(args.argv)
    if refusal is not None:
        raise UsageError(refusal)
    payload: dict[str, Any] = {"image": args.image, "command": list(args.argv)}
    optional = {
        "queue": args.queue,
        "gpus": args.gpus,
        "time_limit_s": args.time_limit_s,
        "gpu_model": args.gpu_model,
        "min_gpu_memory_mb": args.min_gpu_memory,
        "cpus": args.cpus,
        "memory_mb": args.memory,
        "name": args.name,
        "reservation": args.reservation,
        "dependency": args.dependency,
        "project": args.project,
    }
    payload.update({k: v for k, v in optional.items() if v is not None})
    if args.shared_slot:
        payload["shared_slot"] = True
    if args.preemptible:
        payload["preemptible"] = True
    if args.env:
        payload["env"] = dict(args.env)
    if args.mount:
        payload["mounts"] = list(args.mount)
    if args.array:
        return _submit_array(args, client, payload)
    created = client.post("/api/v1/jobs/", payload)
    job = client.get(f"/api/v1/jobs/{created['id']}/")
    if args.json:
        dump_json(job)
        return EXIT_OK
    label = f" ({job['name']})" if job.get("name") else ""
    print(f"Submitted job {job['id']}{label} to the {job['queue']} queue.")
    print(f"  state:            {job['state']}")
    if job["state"] in ("pending", "held"):
        position = job.get("queue_position")
        print(
            f"  queue position:   {position if position is not None else 'not placed yet (the scheduler runs within seconds)'}"
        )
        print(
            f"  estimated start:  {when(job.get('estimated_start'), relative=True, empty='not estimated yet')}"
        )
        if job.get("pending_reason_text"):
            print(f"  waiting because:  {job['pending_reason_text']}")
    elif job.get("started_at"):
        print(
            f"  started:          {when(job['started_at'], relative=True)} on {job.get('node') or '-'}"
        )
    print(f"Follow it with: labctl status {job['id']}   ·   labctl logs {job['id']} --follow")
    return EXIT_OK


def _submit_array(args: argparse.Namespace, client: Client, payload: dict[str, Any]) -> int:
    """One job per index, in one request: the portal queues all of them or none."""
    created = client.post("/api/v1/jobs/array/", dict(payload, array=array_text(args.array)))
    if args.json:
        dump_json(created)
        return EXIT_OK
    ids = created["ids"]
    print(
        f"Submitted {len(ids)} jobs to the {created['queue']} queue: {ids[0]}–{ids[-1]} "
        f"(array {created['array_id']})."
    )
    print(
        f"Follow them with: labctl status   ·   cancel them all with: labctl cancel {created['array_id']} --array"
    )
    return EXIT_OK


def _start_column(job: dict[str, Any]) -> str:
    if job.get("started_at"):
        return when(job["started_at"])
    if job.get("estimated_start"):
        return "~" + when(job["estimated_start"])
    return "-"


def cmd_status(args: argparse.Namespace, client: Client) -> int:
    if args.job_id is not None:
        return _job_details(args, client)
    active = None if (args.all or args.state) else "true"
    jobs = client.get_list(
        "/api/v1/jobs/", limit=args.limit, active=active, state=args.state, queue=args.queue
    )
    if args.json:
        dump_json(jobs)
        return EXIT_OK
    if not jobs:
        print(
            "No jobs."
            if args.all or args.state
            else "No waiting or running jobs (labctl status --all shows finished ones)."
        )
        return EXIT_OK
    owners = {j.get("owner") for j in jobs}
    headers = ["ID", "NAME", "QUEUE", "GPUS", "STATE", "POS", "START", "NODE"]
    if len(owners) > 1:
        headers.insert(1, "OWNER")
    rows = []
    for j in jobs:
        gpus = "shared" if j.get("shared_slot") else j.get("gpus")
        row = [
            j["id"],
            j.get("name"),
            j.get("queue"),
            gpus,
            j.get("state"),
            j.get("queue_position"),
            _start_column(j),
            j.get("node"),
        ]
        if len(owners) > 1:
            row.insert(1, j.get("owner"))
        rows.append(row)
    print(table(headers, rows))
    return EXIT_OK


def _command_line(command: list[Any]) -> str:
    """As the member typed it: a shell line (`/bin/sh -c LINE`) shows as the line."""
    if len(command) == 3 and command[:2] == ["/bin/sh", "-c"]:
        return str(command[2])
    return shlex.join(str(p) for p in command)


def _job_details(args: argparse.Namespace, client: Client) -> int:
    job = client.get(f"/api/v1/jobs/{args.job_id}/")
    events = client.get(f"/api/v1/jobs/{args.job_id}/events/")
    if args.json:
        dump_json({**job, "events": events})
        return EXIT_OK
    gpus = "1 shared slot" if job.get("shared_slot") else str(job.get("gpus"))
    limit = job.get("time_limit_s")
    fields: list[tuple[str, Any]] = [
        ("job", f"{job['id']}" + (f" ({job['name']})" if job.get("name") else "")),
        ("owner", job.get("owner")),
        ("state", job.get("state")),
        ("queue", job.get("queue")),
        ("image", job.get("image")),
        ("command", _command_line(job.get("command") or [])),
        (
            "gpus",
            gpus
            + (f", model {job['gpu_model']}" if job.get("gpu_model") else "")
            + (f", ≥{job['min_gpu_memory_mb']} MiB each" if job.get("min_gpu_memory_mb") else ""),
        ),
        ("cpus / memory", f"{job.get('cpus')} / {job.get('memory_mb')} MiB"),
        ("time limit", span(limit) if limit else "-"),
        ("preemptible", "yes" if job.get("preemptible") else "no"),
    ]
    if job.get("reservation"):
        fields.append(("reservation", job["reservation"]))
    if job.get("project"):
        fields.append(("project", job["project"]))
    if job.get("dependency"):
        fields.append(("runs after", job["dependency"]))
    if job.get("mounts"):
        fields.append(("mounts", ", ".join(job["mounts"])))
    fields.append(("submitted", when(job.get("submitted_at"), relative=True)))
    if job.get("state") in ("pending", "held"):
        fields.append(
            (
                "queue position",
                job.get("queue_position") if job.get("queue_position") is not None else "-",
            )
        )
        fields.append(("estimated start", when(job.get("estimated_start"), relative=True)))
        if job.get("pending_reason_text"):
            fields.append(("waiting because", job["pending_reason_text"]))
    if job.get("started_at"):
        fields.append(("started", when(job["started_at"], relative=True)))
    if job.get("node"):
        fields.append(
            (
                "node",
                job["node"] + (f" ({', '.join(job['gpu_uuids'])})" if job.get("gpu_uuids") else ""),
            )
        )
    if job.get("ended_at"):
        fields.append(("ended", when(job["ended_at"], relative=True)))
    if job.get("exit_code") is not None:
        fields.append(("exit code", job["exit_code"]))
    if job.get("end_reason"):
        fields.append(("end reason", job["end_reason"]))
    width = max(len(k) for k, _ in fields)
    for key, value in fields:
        print(f"{key + ':':<{width + 1}} {value if value not in (None, '') else '-'}")
    print()
    if events:
        print("Events:")
        print(
            table(
                ["WHEN", "KIND", "MESSAGE"],
                [[when(e.get("created_at")), e.get("kind"), e.get("message")] for e in events],
            )
        )
    else:
        print("No events yet.")
    return EXIT_OK


def cmd_queue(args: argparse.Namespace, client: Client) -> int:
    overview = client.get("/api/v1/queues/overview/")
    if args.json:
        dump_json(overview)
        return EXIT_OK
    waiting, running = overview.get("waiting", []), overview.get("running", [])
    print(f"Waiting ({len(waiting)}):")
    if waiting:
        print(
            table(
                ["POS", "ID", "OWNER", "QUEUE", "GPUS", "EST. START", "REASON"],
                [
                    [
                        j.get("queue_position"),
                        j["id"],
                        j.get("owner"),
                        j.get("queue"),
                        "shared" if j.get("shared_slot") else j.get("gpus"),
                        when(j.get("estimated_start")),
                        j.get("pending_reason_text") or j.get("pending_reason"),
                    ]
                    for j in waiting
                ],
            )
        )
    print(f"\nRunning ({len(running)}):")
    if running:
        print(
            table(
                ["ID", "OWNER", "QUEUE", "GPUS", "STATE", "STARTED", "EXPECTED END"],
                [
                    [
                        j["id"],
                        j.get("owner"),
                        j.get("queue"),
                        "shared" if j.get("shared_slot") else j.get("gpus"),
                        j.get("state"),
                        when(j.get("started_at")),
                        when(j.get("expected_end")),
                    ]
                    for j in running
                ],
            )
        )
    return EXIT_OK


def _cancel_line(job: dict[str, Any]) -> str:
    """What a cancel did: a waiting job ends at once, a running one is being stopped."""
    if job["state"] in FINAL_JOB_STATES:
        return f"Job {job['id']}: {job['state']}."
    return (
        f"Job {job['id']}: cancel requested; it is being stopped (SIGTERM, then its grace "
        f"period). Follow it with: labctl status {job['id']}"
    )


def cmd_cancel(args: argparse.Namespace, client: Client) -> int:
    worst = EXIT_OK
    done = []
    for job_id in args.job_ids:
        try:
            if args.array:
                jobs = client.post(f"/api/v1/jobs/{job_id}/cancel-array/")
            else:
                jobs = [client.post(f"/api/v1/jobs/{job_id}/cancel/")]
        except ApiRefusal as error:
            message = error.message
            if error.status == 404:
                message = (
                    f"Job {job_id} not found: it does not exist or is not yours. ({error.message})"
                )
            print(
                f"error: job {job_id}: {message}" if error.status != 404 else f"error: {message}",
                file=sys.stderr,
            )
            worst = EXIT_REFUSED
            continue
        done.extend(jobs)
        if args.array and not jobs and not args.json:
            print(f"Array of job {job_id}: every job has already ended.")
        for job in jobs if not args.json else ():
            print(_cancel_line(job))
    if args.json:
        dump_json(done)
    return worst


def _size_options(p: argparse.ArgumentParser) -> None:
    """--gpus and --time, as submit and session start take them."""
    p.add_argument("--gpus", type=int, help="number of whole GPUs (default 1)")
    p.add_argument(
        "--time",
        type=argtype(parse_duration),
        dest="time_limit_s",
        metavar="DURATION",
        help="time limit: 3600, 90m, 2h, 1h30m, 1d (default: the queue's)",
    )


def cmd_session(args: argparse.Namespace, client: Client) -> int:
    if args.action == "start":
        if not args.image:
            print(
                "error: session start needs --image (one from the lab's allowlist)", file=sys.stderr
            )
            return EXIT_REFUSED
        body: dict[str, Any] = {"kind": args.kind, "image": args.image}
        for key in ("queue", "gpus", "time_limit_s", "reservation"):
            if getattr(args, key) is not None:
                body[key] = getattr(args, key)
        session = client.post("/api/v1/sessions/", json=body)
        if args.json:
            dump_json(session)
        else:
            job = session["job"]
            print(f"Session {job['id']} ({job['kind']}) queued in {job['queue']}: {job['state']}.")
            print(f"Open it with: labctl session open {job['id']}")
        return EXIT_OK
    if args.action == "list":
        rows = client.get_list("/api/v1/sessions/")
        if args.json:
            dump_json(rows)
        else:
            print(
                table(
                    ["ID", "KIND", "QUEUE", "STATE", "NODE"],
                    [
                        [
                            r["job"]["id"],
                            r["job"]["kind"],
                            r["job"]["queue"],
                            r["job"]["state"],
                            r["job"]["node"] or "-",
                        ]
                        for r in rows
                    ],
                )
            )
        return EXIT_OK
    if args.session_id is None:
        print(f"error: session {args.action} needs the session's ID", file=sys.stderr)
        return EXIT_REFUSED
    if args.action == "stop":
        session = client.post(f"/api/v1/sessions/{args.session_id}/stop/")
        if args.json:
            dump_json(session)
        else:
            print(f"Session {args.session_id}: stop requested ({session['job']['state']}).")
        return EXIT_OK
    session = client.get(f"/api/v1/sessions/{args.session_id}/")
    url = client.url + session["url"]
    if args.json:
        dump_json({**session, "url": url})
    elif session["ready"]:
        print(url)
    else:
        print(
            f"Session {args.session_id} is not ready yet ({session['job']['state']}); it opens at {url}"
        )
    return EXIT_OK if session["ready"] else EXIT_REFUSED


def new_output(previous: str, current: str) -> str:
    """What `current` adds to `previous`, for log tails that slide: overlap by whole lines."""
    if not previous:
        return current
    if current.startswith(previous):
        return current[len(previous) :]
    old, new = previous.splitlines(keepends=True), current.splitlines(keepends=True)
    for size in range(min(len(old), len(new)), 0, -1):
        if old[-size:] == new[:size]:
            return "".join(new[size:])
    return current if current != previous else ""


def cmd_logs(args: argparse.Namespace, client: Client) -> int:
    """The job's whole log (or its last ``--tail`` lines), then with ``-f`` its new output."""
    if args.refresh:
        client.get(f"/api/v1/jobs/{args.job_id}/logs/", refresh="1")
    path = f"/api/v1/jobs/{args.job_id}/log/"
    body = client.get(path, tail=args.tail) if args.tail is not None else client.get(path)
    if args.json and not args.follow:
        dump_json(body)
        return EXIT_OK
    if not body.get("full", True):
        return _logs_tail_only(args, client, body)
    _emit(args, body)
    while True:
        state = body.get("state")
        caught_up = body["next_offset"] >= body["size"]
        if body.get("complete") and caught_up:
            break
        if not body.get("text") or caught_up:
            if not args.follow:
                break
            if state in FINAL_JOB_STATES and not body.get("text"):
                break  # ended, and its node sends no more
            time.sleep(FOLLOW_INTERVAL_S)
        body = client.get(path, offset=body["next_offset"])
        _emit(args, body)
    if args.follow and not args.json:
        print(f"(job {args.job_id} is {body.get('state')})", file=sys.stderr)
    elif not body.get("size") and not args.json:
        print(f"(no output yet; job {args.job_id} is {body.get('state')})", file=sys.stderr)
    return EXIT_OK


def _emit(args: argparse.Namespace, body: dict[str, Any]) -> None:
    text = body.get("text") or ""
    if args.json:
        if text:
            print(json.dumps(body, ensure_ascii=False), flush=True)
    elif text:
        sys.stdout.write(text)
        sys.stdout.flush()


def _logs_tail_only(args: argparse.Namespace, client: Client, body: dict[str, Any]) -> int:
    """A job with no full log (its node runs an agent of an earlier release): its tail."""
    tail = body.get("text") or ""
    if args.json:  # with --follow: one compact JSON object per line, each time the tail changes
        print(json.dumps(body, ensure_ascii=False), flush=True)
    else:
        _write(tail)
    if not args.follow:
        if not tail and not args.json:
            print(f"(no output yet; job {args.job_id} is {body.get('state')})", file=sys.stderr)
        return EXIT_OK
    state = body.get("state")
    path = f"/api/v1/jobs/{args.job_id}/log/"
    while state not in FINAL_JOB_STATES:
        time.sleep(FOLLOW_INTERVAL_S)
        body = client.get(path)
        state = body.get("state")
        current = body.get("text") or ""
        if args.json:
            if current != tail:
                print(json.dumps(body, ensure_ascii=False), flush=True)
        else:
            _write(new_output(tail, current))
        tail = current
    if not args.json:
        print(f"(job {args.job_id} is {state})", file=sys.stderr)
    return EXIT_OK


def _write(text: str) -> None:
    if text:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()


# --- bookings ------------------------------------------------------------------------------------


def _slot_line(slot: dict[str, Any]) -> str:
    labels = ", ".join(slot.get("gpu_labels") or []) or f"{len(slot.get('gpus') or [])} GPUs"
    return f"{slot.get('node', '?')} [{labels}] {when(slot.get('start'))} – {when(slot.get('end'))}"


def _book_command(slot: dict[str, Any]) -> str:
    start, end = parse_iso(slot.get("start")), parse_iso(slot.get("end"))
    hours = f"{(end - start).total_seconds() / 3600:g}" if start and end else "H"
    return (
        f"labctl book --gpus {len(slot.get('gpus') or [])} --node {slot.get('node')} "
        f'--start "{when(slot.get("start"))}" --hours {hours}'
    )


def _print_booking(r: dict[str, Any], verb: str) -> None:
    labels = ", ".join(r.get("gpu_labels") or [])
    print(
        f"{verb} booking {r['id']}: {labels}, {when(r.get('start'))} – {when(r.get('end'))} ({r.get('state')})."
    )
    if _number(r.get("charged")):
        print(f"  charged: {r['charged']} credits")


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def cmd_book(args: argparse.Namespace, client: Client) -> int:
    if args.action:
        return _book_action(args, client)
    if args.reservation_id is not None:
        raise UsageError("To act on a booking say what to do: labctl book cancel|release|extend ID")
    missing = [
        flag
        for flag, value in (("--gpus", args.gpus), ("--start", args.start), ("--hours", args.hours))
        if value is None
    ]
    if missing:
        raise UsageError(
            f"labctl book needs {', '.join(missing)}, e.g. "
            'labctl book --gpus 2 --start "2026-12-01 14:00" --hours 3'
        )
    if args.gpus < 1:
        raise UsageError("Book at least one GPU (--gpus 1 or more).")
    start = args.start
    end = start + timedelta(hours=args.hours)
    payload: dict[str, Any] = {
        "start": start.isoformat(),
        "end": end.isoformat(),
        "note": args.note,
    }
    if args.node:
        payload.update(node=args.node, gpu_count=args.gpus)
    else:
        # The API books by node or GPU ids; find a node with N GPUs free at exactly that time.
        try:
            slot = client.get(
                "/api/v1/reservations/suggest/",
                gpu_count=args.gpus,
                hours=f"{args.hours:.2f}",
                after=start.isoformat(),
            )
        except ApiRefusal as error:
            raise ApiRefusal(
                error.message, status=error.status, code=error.code, body=error.body
            ) from None
        slot_start = parse_iso(slot.get("start"))
        if slot_start is None or slot_start != start:
            raise ApiRefusal(
                f"No node has {args.gpus} GPU(s) free at {when(start.isoformat())} for {args.hours:g} h.",
                status=409,
                code="conflict",
                body={"suggestion": slot},
            )
        payload.update(gpus=slot["gpus"])
    reservation = client.post("/api/v1/reservations/", payload)
    if args.json:
        dump_json(reservation)
    else:
        _print_booking(reservation, "Booked")
    return EXIT_OK


def _book_action(args: argparse.Namespace, client: Client) -> int:
    if args.reservation_id is None:
        raise UsageError(f"Which booking? labctl book {args.action} ID (see labctl bookings)")
    path = f"/api/v1/reservations/{args.reservation_id}/"
    if args.action == "extend":
        if (args.hours is None) == (args.until is None):
            raise UsageError("Extend by --hours H or to --until TIME (one of the two).")
        if args.until is not None:
            new_end = args.until
        else:
            current = parse_iso(client.get(path).get("end"))
            if current is None:
                raise ApiRefusal("The booking has no end time.", status=500)
            new_end = current + timedelta(hours=args.hours)
        reservation = client.post(path + "extend/", {"end": new_end.isoformat()})
        verb = "Extended"
    else:
        reservation = client.post(path + f"{args.action}/")
        verb = {"cancel": "Cancelled", "release": "Released"}[args.action]
    if args.json:
        dump_json(reservation)
    else:
        _print_booking(reservation, verb)
    return EXIT_OK


def cmd_bookings(args: argparse.Namespace, client: Client) -> int:
    bookings = client.get_list("/api/v1/reservations/", state=args.state)
    if not args.all and not args.state:
        bookings = [b for b in bookings if b.get("state") in ("booked", "active")]
    if args.json:
        dump_json(bookings)
        return EXIT_OK
    if not bookings:
        print(
            "No bookings."
            if args.all or args.state
            else "No upcoming bookings (labctl bookings --all shows past ones)."
        )
        return EXIT_OK
    owners = {b.get("user") for b in bookings}
    headers = ["ID", "GPUS", "START", "END", "STATE", "CHARGED", "NOTE"]
    if len(owners) > 1:
        headers.insert(1, "USER")
    rows = []
    for b in bookings:
        row = [
            b["id"],
            ", ".join(b.get("gpu_labels") or []),
            when(b.get("start")),
            when(b.get("end")),
            b.get("state") + (" (maintenance)" if b.get("is_maintenance") else ""),
            b.get("charged"),
            b.get("note"),
        ]
        if len(owners) > 1:
            row.insert(1, b.get("user"))
        rows.append(row)
    print(table(headers, rows))
    return EXIT_OK


def cmd_suggest(args: argparse.Namespace, client: Client) -> int:
    slot = client.get(
        "/api/v1/reservations/suggest/",
        gpu_count=args.gpus,
        hours=f"{args.hours:.2f}",
        node=args.node,
        after=args.after.isoformat() if args.after else None,
    )
    if args.json:
        dump_json(slot)
        return EXIT_OK
    print("Earliest free slot: " + _slot_line(slot))
    print("Book it with: " + _book_command(slot))
    return EXIT_OK


# --- credits -------------------------------------------------------------------------------------


def cmd_credits(args: argparse.Namespace, client: Client) -> int:
    summary = client.get("/api/v1/credits/")
    entries = (
        client.get_list("/api/v1/ledger/", limit=max(args.entries, 1)) if args.entries > 0 else []
    )
    if args.json:
        dump_json({"credits": summary, "ledger": entries})
        return EXIT_OK
    print(f"Credits of {summary.get('username')}")
    print(f"  balance:        {summary.get('balance')}")
    print(f"  burn rate:      {summary.get('burn_per_day')} per day (last 7 days)")
    empty = "already used up" if _number(summary.get("balance")) <= 0 else "not at this rate"
    print(f"  runs out:       {when(summary.get('runs_out_at'), relative=True, empty=empty)}")
    print(f"  next grant on:  {summary.get('next_grant_on') or '-'}")
    print()
    if entries:
        print(f"Latest {len(entries)} ledger entries:")
        print(
            table(
                ["WHEN", "KIND", "AMOUNT", "BALANCE", "FOR", "NOTE"],
                [
                    [
                        when(e.get("created_at")),
                        e.get("kind_display") or e.get("kind"),
                        e.get("amount"),
                        e.get("balance_after"),
                        f"job {e['job']}"
                        if e.get("job")
                        else (f"booking {e['reservation']}" if e.get("reservation") else ""),
                        e.get("note"),
                    ]
                    for e in entries
                ],
            )
        )
    else:
        print("No ledger entries yet.")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

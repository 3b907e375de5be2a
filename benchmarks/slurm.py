"""Slurm mode's figures, each against its baseline in the same run on this machine.

1. Submit throughput: jobs per second through the portal's API in Slurm mode (validation,
   the job row, a JWT, slurmrestd, the Slurm job row), against plain ``sbatch`` and against
   slurmrestd called directly, on the same private Slurm (benchmarks.local_slurm). The partition is
   down, so every job stays pending and nothing else competes for the CPUs.
2. Reconciliation: one sync pass over 10,000 Slurm jobs (scripted answers, no Slurm
   needed): the first pass records them all, the second finds nothing to change.

    python -m benchmarks.slurm [--jobs 200] [--sync-jobs 10000] [--json]

Without Slurm installed (or not root) the submit figures print "not measured".
Ports: LABPORTAL_BENCH_SLURM_PORT_BASE (4 in a row, default 8815). The portal's
database is a temporary SQLite file, or DATABASE_URL's PostgreSQL under ``<name>_slurmbench``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from typing import Any


def _django(var_dir: str) -> tuple[str, str] | None:
    """Set up Django on a private database; returns (admin_url, name) to drop, if PostgreSQL."""
    source = os.environ.get("DATABASE_URL", "")
    dropped: tuple[str, str] | None = None
    if source.startswith("postgres"):
        from benchmarks.portal import bench_database_url, recreate_database

        bench_url, admin_url, name = bench_database_url(source, "slurmbench")
        recreate_database(admin_url, name)
        os.environ["DATABASE_URL"] = bench_url
        dropped = (admin_url, name)
    else:
        os.environ["DATABASE_URL"] = f"sqlite:///{var_dir}/bench.sqlite3"
    os.environ.update(
        {
            "LABPORTAL_VAR_DIR": var_dir,
            "CELERY_BROKER_URL": f"filesystem://{var_dir}/broker",
            "LOG_LEVEL": "ERROR",
        }
    )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "labportal.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return dropped


def _submit_figures(jobs: int) -> dict[str, Any]:
    from django.conf import settings
    from rest_framework.test import APIClient

    from accounts.models import User
    from benchmarks.local_slurm import LocalSlurm, Ports
    from jobqueue.models import ContainerImage, Queue
    from slurm.cli import RestClient, SubmitRequest
    from slurm.models import QueueMapping, SlurmJob, UnixLogin
    from slurm.services import slurm_inventory_sync

    base = int(os.environ.get("LABPORTAL_BENCH_SLURM_PORT_BASE", "8815"))
    local = LocalSlurm(gpus=4, ports=Ports.from_env(base=base), rest=True)
    try:
        local.start()
        local._run("scontrol", "update", f"PartitionName={local.partition}", "State=DOWN")
        settings.LABPORTAL_EXECUTOR = "slurm"
        settings.LABPORTAL_SLURM_REST_URL = local.rest_url
        settings.LABPORTAL_SLURM_JWT_KEY_FILE = str(local.jwt_key)
        settings.LABPORTAL_SLURM_SERVICE_USER = "root"
        settings.LABPORTAL_SLURM_OUTPUT_DIR = str(local.output_dir)
        slurm_inventory_sync()
        member = User.objects.create_user("benchmember", password="x")
        UnixLogin.objects.create(user=member, username="nobody")
        QueueMapping.objects.update(qos="", partition="")
        ContainerImage.objects.get_or_create(reference="labportal/busybox:test")
        Queue.objects.filter(name="normal").update(max_gpus_per_job=4)
        api = APIClient()
        api.force_authenticate(member)
        payload = {
            "image": "labportal/busybox:test",
            "command": "true",
            "gpus": 1,
            "cpus": 1,
            "memory_mb": 64,
        }

        def portal() -> None:
            response = api.post("/api/jobs/", payload, format="json")
            if response.status_code != 201:
                raise RuntimeError(f"portal refused a job: {response.content[:300]!r}")

        def plain_sbatch() -> None:
            local.run_as(
                "nobody",
                "sbatch",
                "--gres=gpu:1",
                "-o",
                "/dev/null",
                "--chdir",
                str(local.output_dir),
                "--wrap=true",
            )

        rest = RestClient(url=local.rest_url, key=local.jwt_key.read_bytes(), service_user="root")
        request = SubmitRequest(
            unix_user="nobody",
            script="#!/bin/bash\ntrue\n",
            name="bench",
            output_path="/dev/null",
            workdir=str(local.output_dir),
            time_limit_s=600,
            gpus=1,
        )

        def direct_rest() -> None:
            rest.submit(request)

        def portal_agents() -> None:
            # The same portal path in agents mode: what the portal costs without Slurm.
            settings.LABPORTAL_EXECUTOR = "agents"
            try:
                portal()
            finally:
                settings.LABPORTAL_EXECUTOR = "slurm"

        rates: dict[str, float] = {}
        # Interleaved rounds, so a noisy neighbour slows every path alike.
        rounds = 4
        spent = {"sbatch": 0.0, "slurmrestd": 0.0, "portal": 0.0, "portal_agents_mode": 0.0}
        for _ in range(rounds):
            for name, call in (
                ("sbatch", plain_sbatch),
                ("slurmrestd", direct_rest),
                ("portal", portal),
                ("portal_agents_mode", portal_agents),
            ):
                began = time.perf_counter()
                for _i in range(jobs // rounds):
                    call()
                spent[name] += time.perf_counter() - began
        per_path = (jobs // rounds) * rounds
        for name, seconds in spent.items():
            rates[f"{name}_jobs_per_s"] = round(per_path / seconds, 1)
        rates["jobs_per_path"] = per_path
        rates["portal_jobs_in_slurm"] = SlurmJob.objects.filter(job__isnull=False).count()
        rates["portal_vs_sbatch"] = round(
            rates["portal_jobs_per_s"] / rates["sbatch_jobs_per_s"], 2
        )
        return rates
    finally:
        local.stop()


def _sync_figures(count: int) -> dict[str, Any]:
    from accounts.models import User
    from jobqueue.models import ContainerImage, Job, Queue
    from slurm import services
    from slurm.cli import JobInfo
    from slurm.models import SlurmJob, UnixLogin

    member, _created = User.objects.get_or_create(username="syncmember")
    UnixLogin.objects.get_or_create(user=member, defaults={"username": "syncmember"})
    image, _created = ContainerImage.objects.get_or_create(reference="labportal/busybox:test")
    queue = Queue.objects.get(name="normal")
    now = datetime.now(tz=UTC)
    portal_jobs = Job.objects.bulk_create(
        Job(owner=member, queue=queue, image=image, command=["true"], time_limit_s=600)
        for _ in range(count // 10)
    )
    SlurmJob.objects.bulk_create(
        SlurmJob(slurm_job_id=5_000_000 + i, job=job, user=member, unix_user="syncmember")
        for i, job in enumerate(portal_jobs)
    )
    infos = [
        JobInfo(
            job_id=5_000_000 + i,
            user="syncmember",
            state="COMPLETED",
            partition="lab",
            qos="normal",
            account="lab",
            nodes="n1",
            gpus=1,
            submitted_at=now - timedelta(hours=2),
            started_at=now - timedelta(hours=1),
            ended_at=now,
            exit_code=0,
        )
        for i in range(count)
    ]

    class Scripted:
        def jobs(self) -> list[JobInfo]:
            return infos

        def accounting_jobs(self, *, since: datetime) -> list[JobInfo]:
            return []

    timings = {}
    for label in ("first_pass_s", "second_pass_s"):
        began = time.perf_counter()
        result = services.slurm_jobs_sync(client=Scripted())  # type: ignore[arg-type]
        timings[label] = round(time.perf_counter() - began, 2)
        timings[label.replace("_s", "_changed")] = result.changed
    timings["jobs"] = count
    timings["portal_jobs"] = len(portal_jobs)
    return timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=200, help="jobs submitted per path")
    parser.add_argument("--sync-jobs", type=int, default=10_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from benchmarks.local_slurm import LocalSlurm

    var_dir = tempfile.mkdtemp(prefix="labportal-slurmbench-")
    dropped = _django(var_dir)
    results: dict[str, Any] = {}
    try:
        missing = LocalSlurm.missing(rest=True)
        results["submit"] = {"not measured": missing} if missing else _submit_figures(args.jobs)
        results["sync"] = _sync_figures(args.sync_jobs)
    finally:
        from django.db import connection

        connection.close()
        if dropped:
            from benchmarks.portal import recreate_database

            recreate_database(*dropped, drop_only=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    submit = results["submit"]
    print("Slurm mode: submit throughput, one client, same private Slurm")
    if "not measured" in submit:
        print(f"  not measured: {submit['not measured']}")
    else:
        print(f"  baseline: plain sbatch          {submit['sbatch_jobs_per_s']:>8} jobs/s")
        print(f"  slurmrestd with a JWT, direct   {submit['slurmrestd_jobs_per_s']:>8} jobs/s")
        print(f"  portal API in Slurm mode        {submit['portal_jobs_per_s']:>8} jobs/s")
        print(
            f"  portal API in agents mode       {submit['portal_agents_mode_jobs_per_s']:>8} jobs/s"
        )
        print(f"  portal / sbatch                 {submit['portal_vs_sbatch']:>8}x")
    sync = results["sync"]
    print(
        f"Slurm mode: sync pass over {sync['jobs']:,} Slurm jobs ({sync['portal_jobs']:,} portal's)"
    )
    print(f"  first pass (records all)        {sync['first_pass_s']:>8} s")
    print(f"  second pass (nothing to change) {sync['second_pass_s']:>8} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

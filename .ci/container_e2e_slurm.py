"""Slurm mode deployed from the compose file, tested for real: the portal image with Slurm's
client (Dockerfile.slurm) runs web, control worker and beat with docker-compose.slurm.yml's
settings against a private Slurm on this machine (slurmctld, slurmd, slurmdbd, slurmrestd;
benchmarks/local_slurm.py), the containers reaching it with JWTs only (no munge, no sudo):

  1. the Slurm image built on the portal image .ci/container-e2e.sh built;
  2. docker-compose.yml + docker-compose.slurm.yml validated, the overlay's required
     settings enforced, and its resolved settings and mounts the ones the containers get;
  3. from the worker container: the inventory (nodes and GPUs from slurmrestd) and the
     lab's rules (the category's account and the member's association, by sacctmgr);
  4. a member's job submitted over HTTP with an API token runs in Slurm as the member's
     unix user, is synced to completed by the worker and beat, and its output is the job's.

Everything it starts is removed at the end, also on failure. Run by .ci/run after
.ci/container-e2e.sh, from the checkout with its virtual environment:

    CI_DATABASE_URL=postgres://… CI_BROKER_URL=redis://… .venv/bin/python .ci/container_e2e_slurm.py
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.local_slurm import LocalSlurm, Ports  # noqa: E402

PG_URL = os.environ.get("CI_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/labportal")
REDIS_URL = os.environ.get("CI_BROKER_URL", "redis://127.0.0.1:6379/0")
PORT = int(os.environ.get("CONTAINER_E2E_SLURM_PORT", "8602"))
# Ports of its own: the test suite's private Slurms use 8811 and up, the benches 8845 and up.
SLURM_PORTS = Ports(slurmctld=8871, slurmd=8872, slurmdbd=8873, slurmrestd=8874, mariadb=3371)
PORTAL_IMAGE = os.environ.get("LABPORTAL_PORTAL_IMAGE", "labportal/portal:ci")
SLURM_IMAGE = "labportal/portal-slurm:ci"
TEST_IMAGE = os.environ.get("LABPORTAL_TEST_IMAGE", "labportal/busybox:test")
PORTAL_UID = 10001  # the portal image's user (Dockerfile)
MEMBER_UNIX_USER = "nobody"
RUN_ID = f"lpslurm{os.getpid()}"
DB_NAME = f"labportal_slurm_e2e_{os.getpid()}"
started = time.monotonic()


def step(message: str) -> None:
    print(f"container-e2e-slurm: [{time.monotonic() - started:.0f}s] {message}", flush=True)


def fail(message: str) -> None:
    raise SystemExit(f"container-e2e-slurm: {message}")


def run(*argv: str, check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    if check and done.returncode != 0:
        fail(f"{' '.join(argv[:4])} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done


def compose(cfg: Path, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    files = ["-f", str(cfg / "docker-compose.yml"), "-f", str(cfg / "docker-compose.slurm.yml")]
    return run("docker-compose", "--project-directory", str(cfg), *files, *argv, check=check)


def env_file(path: Path, **values: str) -> None:
    text = (ROOT / ".env.example").read_text().replace("CHANGE-ME", "ci0secret0value")
    path.write_text(text + "".join(f"{k}={v}\n" for k, v in values.items()))


def resolved_overlay(cfg: Path, slurm_env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """docker-compose.slurm.yml as compose resolves it: the Slurm settings and the mounts
    of the web service (the worker and beat must have the same)."""
    env_file(cfg / ".env", **slurm_env)
    compose(cfg, "config", "-q")
    config = yaml.safe_load(compose(cfg, "config").stdout)
    services = config["services"]
    web = services["web"]
    for name in ("worker", "beat"):
        if services[name]["environment"] != web["environment"]:
            fail(f"{name} does not get web's settings")
        if services[name]["image"] != web["image"] or services[name]["volumes"] != web["volumes"]:
            fail(f"{name} does not run web's image with web's mounts")
    if web["build"].get("dockerfile") != "Dockerfile.slurm":
        fail(f"web is not built from Dockerfile.slurm: {web['build']}")
    environment = {
        k: str(v)
        for k, v in web["environment"].items()
        if k == "LABPORTAL_EXECUTOR" or k.startswith("LABPORTAL_SLURM_")
    }
    volumes = []
    for volume in web["volumes"]:
        if isinstance(volume, dict):  # compose's long form
            source, target = volume.get("source", ""), volume.get("target", "")
            read_only = volume.get("read_only", False)
            volume = f"{source}:{target}" + (":ro" if read_only else "")
        if volume.split(":", 1)[0].startswith("/"):  # the overlay's bind mounts, not volumes
            volumes.append(volume)
    for name in slurm_env:  # each of the overlay's required settings is enforced
        env_file(cfg / ".env", **{k: v for k, v in slurm_env.items() if k != name})
        if compose(cfg, "config", "-q", check=False).returncode == 0:
            fail(f"docker-compose.slurm.yml accepted a .env without {name}")
    return environment, volumes


def wait_healthy(name: str, limit_s: int) -> None:
    for _ in range(limit_s):
        state = json.loads(run("docker", "inspect", "--format", "{{json .State}}", name).stdout)
        if state.get("Health", {}).get("Status") == "healthy":
            return
        if not state.get("Running"):
            fail(f"{name} exited")
        time.sleep(1)
    fail(f"{name} not healthy after {limit_s} s")


def manage_shell(container: str, code: str) -> str:
    entrypoint = "/opt/labportal/app/deploy/docker/entrypoint.sh"
    done = run(
        "docker", "exec", container, entrypoint, "manage", "shell", "--no-imports", "-c", code
    )
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def api(method: str, path: str, token: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{PORT}{path}",
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        fail(f"{method} {path}: {exc.code} {exc.read()[:500]!r}")


def main() -> None:
    containers: list[str] = []
    slurm = LocalSlurm(
        ports=SLURM_PORTS,
        accounting=True,
        rest=True,
        partition="lab",
        cluster_name="lpcompose",
        gpu_types=(("a100", 2),),
    )
    cfg = Path(tempfile.mkdtemp(prefix="labportal-slurm-compose-"))
    conf_dir = Path(tempfile.mkdtemp(prefix="labportal-slurm-conf-"))
    pg_server = PG_URL.rsplit("/", 1)[0]
    database_url = f"{pg_server}/{DB_NAME}"
    try:
        step(f"building {SLURM_IMAGE} on {PORTAL_IMAGE} (Dockerfile.slurm)")
        run(
            "docker", "build", "-q", "-f", "Dockerfile.slurm",
            "--build-arg", f"PORTAL_IMAGE={PORTAL_IMAGE}", "-t", SLURM_IMAGE, ".",
            cwd=ROOT, env={**os.environ, "DOCKER_BUILDKIT": "0"},
        )  # fmt: skip

        step("private Slurm (accounting, slurmrestd, JWT in slurm.conf and slurmdbd.conf)")
        slurm.start()
        slurm.add_user(MEMBER_UNIX_USER)
        # The folder LABPORTAL_SLURM_CONF_DIR names: the cluster's slurm.conf and its key,
        # the key readable by the portal's uid alone.
        conf_dir.chmod(0o755)
        shutil.copy(slurm.env["SLURM_CONF"], conf_dir / "slurm.conf")
        (conf_dir / "slurm.conf").chmod(0o644)
        shutil.copy(slurm.jwt_key, conf_dir / "jwt_hs256.key")
        os.chown(conf_dir / "jwt_hs256.key", PORTAL_UID, PORTAL_UID)
        (conf_dir / "jwt_hs256.key").chmod(0o400)

        step("docker-compose.yml + docker-compose.slurm.yml")
        for name in ("docker-compose.yml", "docker-compose.slurm.yml"):
            shutil.copy(ROOT / name, cfg / name)
        overlay_env, mounts = resolved_overlay(
            cfg,
            {
                "LABPORTAL_SLURM_REST_URL": slurm.rest_url,
                "LABPORTAL_SLURM_CONF_DIR": str(conf_dir),
                "LABPORTAL_SLURM_OUTPUT_DIR": str(slurm.output_dir),
            },
        )
        if overlay_env.get("LABPORTAL_SLURM_COMMANDS_AUTH") != "jwt":
            fail(f"the overlay's commands do not use JWT: {overlay_env}")

        step(f"database {DB_NAME}; web, control worker and beat (host network)")
        run("psql", f"{pg_server}/postgres", "-qc", f"CREATE DATABASE {DB_NAME}")
        portal_env = {
            "DEBUG": "false",
            "SECRET_KEY": "container-e2e-slurm-" + secrets.token_hex(24),
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "DATABASE_URL": database_url,
            "CELERY_BROKER_URL": REDIS_URL,
            "WEB_BIND": f"127.0.0.1:{PORT}",
            "GUNICORN_WORKERS": "2",
            "SESSION_COOKIE_SECURE": "false",
            "CSRF_COOKIE_SECURE": "false",
            "LABPORTAL_BACKUP_ENABLED": "false",
            **overlay_env,
            # This Slurm's administrator is root (SlurmUser=root), and the test waits less.
            "LABPORTAL_SLURM_SERVICE_USER": "root",
            "LABPORTAL_SLURM_SYNC_S": "2",
        }
        flags = [f"--env={k}={v}" for k, v in portal_env.items()]
        flags += [f"--volume={m}" for m in mounts]
        for role in ("web", "worker", "beat"):
            name = f"{RUN_ID}-{role}"
            run(
                "docker", "run", "-d", "--name", name, "--network", "host",
                "--health-interval", "2s", "--health-start-period", "120s",
                *flags, SLURM_IMAGE, role,
            )  # fmt: skip
            containers.append(name)
            if role == "web":
                wait_healthy(name, 150)  # the web role migrates first
        web, worker = f"{RUN_ID}-web", f"{RUN_ID}-worker"
        processes = run("docker", "exec", web, "sh", "-c", "cat /proc/[0-9]*/comm").stdout
        if "munged" in processes.split():
            fail("a munge daemon runs in the portal's container")

        step("a member with a unix login, an API token and an image")
        token = manage_shell(
            web,
            f"""
from accounts.models import Category, PersonalAccessToken, User
from jobqueue.models import ContainerImage
from slurm.models import UnixLogin
category = Category.objects.create(name="Students")
user = User.objects.create_user("alice", "alice@lab.example", category=category)
UnixLogin.objects.create(user=user, username="{MEMBER_UNIX_USER}")
ContainerImage.objects.get_or_create(reference="{TEST_IMAGE}")
print(PersonalAccessToken.issue(user=user, name="e2e")[1])""",
        )

        step("from the worker container: the inventory (slurmrestd) and the rules (sacctmgr)")
        inventory = manage_shell(
            worker,
            "import json; from dataclasses import asdict; "
            "from slurm.services import slurm_inventory_sync; "
            "print(json.dumps(asdict(slurm_inventory_sync()), default=str))",
        )
        gpus = manage_shell(worker, "from cluster.models import Gpu; print(Gpu.objects.count())")
        if gpus != "2":
            fail(f"the inventory did not bring the node's 2 GPUs: {gpus} ({inventory})")
        policy = manage_shell(
            worker,
            "import json; from dataclasses import asdict; "
            "from slurm.policy import slurm_policy_sync; "
            "print(json.dumps(asdict(slurm_policy_sync()), default=str))",
        )
        associations = slurm.sacctmgr(
            "-Pn", "show", "association", f"user={MEMBER_UNIX_USER}", "format=Account"
        ).split()
        if "lp-students" not in associations:
            fail(f"the rules did not reach Slurm: {associations} (policy pass: {policy})")

        step("a member's job over HTTP runs in Slurm as the member's unix user")
        job = api(
            "POST",
            "/api/jobs/",
            token,
            {
                "image": TEST_IMAGE,
                "command": ["sh", "-c", 'echo "hello from job $LABPORTAL_JOB_ID"'],
                "gpus": 1,
                "cpus": 1,
                "memory_mb": 64,
                "time_limit_s": 300,
            },
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            state = api("GET", f"/api/jobs/{job['id']}/", token)["state"]
            if state in ("completed", "failed", "cancelled", "lost", "timed_out"):
                break
            time.sleep(1)
        if state != "completed":
            fail(f"job {job['id']} ended {state}, not completed")
        record = json.loads(
            manage_shell(
                web,
                "import json; from slurm.models import SlurmJob; "
                f"r = SlurmJob.objects.get(job_id={job['id']}); "
                "print(json.dumps([r.slurm_job_id, r.unix_user, r.output_path]))",
            )
        )
        slurm_id, unix_user, output_path = record
        if unix_user != MEMBER_UNIX_USER:
            fail(f"Slurm ran job {slurm_id} as {unix_user}")
        owner = slurm.run_as(
            MEMBER_UNIX_USER, "sacct", "-X", "-n", "-j", str(slurm_id), "-o", "user%20"
        )
        if owner.split() != [MEMBER_UNIX_USER]:
            fail(f"Slurm's accounting has job {slurm_id} as {owner!r}")
        output = Path(output_path).read_text().strip()
        if output != f"hello from job {job['id']}":
            fail(f"job {job['id']}'s output is {output!r}")
        step("passed")
    except BaseException:
        for name in containers:
            logs = run("docker", "logs", "--tail", "40", name, check=False)
            print(f"--- {name} (last lines)\n{logs.stdout}{logs.stderr}", file=sys.stderr)
        raise
    finally:
        for name in containers:
            run("docker", "rm", "-f", name, check=False)
        run(
            "psql",
            f"{pg_server}/postgres",
            "-qc",
            f"DROP DATABASE IF EXISTS {DB_NAME}",
            check=False,
        )
        slurm.stop()
        shutil.rmtree(cfg, ignore_errors=True)
        shutil.rmtree(conf_dir, ignore_errors=True)


if __name__ == "__main__":
    main()

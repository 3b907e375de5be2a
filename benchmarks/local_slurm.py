"""A private Slurm on this host: the real cluster the Slurm tests and benches run against.

When Debian's Slurm is installed (`apt-get install slurm-wlm slurmdbd slurmrestd munge
mariadb-server`, see .ci/slurm-setup.sh), ``LocalSlurm`` starts munged, slurmctld and
slurmd in a temporary directory, with one node of ``gpus`` GPUs (GRES backed by links to
/dev/null: Slurm counts and hands them out, nothing uses them; ``gpu_types`` declares them
as typed GRES, e.g. two a100 and two l40s) and the given ports. With
``accounting=True`` it also starts a private MariaDB (its own data directory and TCP
port, no grant tables) and slurmdbd, for accounting, QOS and associations; with
``rest=True`` it starts slurmrestd with JWT authentication. Nothing outside that
directory is touched, and ``stop()`` ends every process it started. Without Slurm,
``LocalSlurm.missing()`` says why: the bench prints "not measured", the tests skip.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")
ACCOUNTING_BINARIES = ("slurmdbd", "sacct", "sacctmgr", "mariadbd", "mariadb-install-db")
REST_BINARIES = ("slurmrestd",)


def _which_or_none(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(p) for d in ("/usr/sbin", "/sbin") if (p := Path(d) / name).exists()), None
    )


def _which(name: str) -> str:
    found = _which_or_none(name)
    if found is None:
        raise FileNotFoundError(f"{name} is not installed (see .ci/slurm-setup.sh)")
    return found


@dataclass(frozen=True)
class Ports:
    """The TCP ports of one private Slurm; each helper, bench and CI run uses its own."""

    slurmctld: int = 8801
    slurmd: int = 8802
    slurmdbd: int = 8803
    slurmrestd: int = 8804
    mariadb: int = 3306

    @classmethod
    def from_env(cls, *, base: int = 8811, mariadb: int = 3311) -> Ports:
        """Ports from LABPORTAL_TEST_SLURM_PORT_BASE (4 in a row) and LABPORTAL_TEST_MARIADB_PORT."""
        base = int(os.environ.get("LABPORTAL_TEST_SLURM_PORT_BASE", base))
        return cls(
            slurmctld=base,
            slurmd=base + 1,
            slurmdbd=base + 2,
            slurmrestd=base + 3,
            mariadb=int(os.environ.get("LABPORTAL_TEST_MARIADB_PORT", mariadb)),
        )


class LocalSlurm:
    """munged + slurmctld + slurmd on this host, one node with ``gpus`` GPUs.

    ``accounting`` adds MariaDB + slurmdbd (with associations, limits and QOS enforced,
    account ``lab`` and QOS ``high`` and ``debug`` next to Slurm's ``normal``); ``rest``
    adds slurmrestd on ``rest_url`` taking JWTs signed with ``jwt_key``.
    """

    def __init__(
        self,
        *,
        gpus: int = 4,
        cpus: int = 16,
        ports: tuple[int, int] | Ports = (8801, 8802),
        accounting: bool = False,
        rest: bool = False,
        partition: str = "bench",
        cluster_name: str = "lpbench",
        gpu_types: tuple[tuple[str, int], ...] = (),
    ):
        # ``gpu_types``: typed GRES, e.g. (("a100", 2), ("l40s", 2)); then ``gpus`` is their sum.
        self.gpu_types = tuple(gpu_types)
        self.gpus = sum(n for _, n in self.gpu_types) if self.gpu_types else gpus
        self.cpus = cpus
        self.port = ports if isinstance(ports, Ports) else Ports(*ports)
        self.ports = (self.port.slurmctld, self.port.slurmd)
        self.accounting = accounting
        self.rest = rest
        self.partition = partition
        self.cluster_name = cluster_name
        self.dir = Path(tempfile.mkdtemp(prefix="labportal-slurm-"))
        self.dir.chmod(0o755)  # jobs run as members' unix users and read their scripts here
        self.node = socket.gethostname().split(".")[0]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.dir / "slurm.conf")}
        self.env.pop("SLURM_JWT", None)
        self.jwt_key = self.dir / "jwt_hs256.key"
        self.rest_url = f"http://127.0.0.1:{self.port.slurmrestd}"
        # Job output goes here: world-writable and sticky, like /tmp, for every member's user.
        self.output_dir = self.dir / "output"

    @staticmethod
    def missing(*, accounting: bool = False, rest: bool = False) -> str | None:
        """Why Slurm (with accounting / slurmrestd if asked) cannot run here, or None."""
        wanted = (
            BINARIES + (ACCOUNTING_BINARIES if accounting else ()) + (REST_BINARIES if rest else ())
        )
        absent = [b for b in wanted if _which_or_none(b) is None]
        if absent:
            return "Slurm is not installed (bash .ci/slurm-setup.sh): no " + ", ".join(absent)
        if os.geteuid() != 0:
            return "starting a private Slurm needs root (slurmd runs jobs as their users)"
        return None

    # -- life cycle ----------------------------------------------------------

    def start(self, timeout_s: float = 90) -> None:
        d = self.dir
        for sub in ("state", "spool"):
            (d / sub).mkdir()
        self.output_dir.mkdir()
        self.output_dir.chmod(0o1777)
        key = d / "munge.key"
        subprocess.run([_which("mungekey"), "-c", "-k", str(key)], check=True)
        key.chmod(0o400)
        subprocess.run(
            [
                _which("munged"),
                "--force",
                f"--socket={d / 'munge.sock'}",
                f"--key-file={key}",
                f"--log-file={d / 'munged.log'}",
                f"--pid-file={d / 'munged.pid'}",
                f"--seed-file={d / 'munged.seed'}",
            ],
            check=True,
        )
        kinds = [kind for kind, n in self.gpu_types for _ in range(n)] or [""] * self.gpus
        lines = []
        for i, kind in enumerate(kinds):
            link = d / f"gpu{i}"
            link.symlink_to("/dev/null")  # a character device: Slurm accepts it as a GPU file
            typed = f" Type={kind}" if kind else ""
            lines.append(f"NodeName={self.node} Name=gpu{typed} File={link}\n")
        (d / "gres.conf").write_text("".join(lines))
        self.jwt_key.write_bytes(secrets.token_bytes(32))
        self.jwt_key.chmod(0o400)
        (d / "slurm.conf").write_text(self._slurm_conf())
        if self.accounting:
            self._start_accounting(timeout_s)
            self.sacctmgr("add", "cluster", self.cluster_name, check=False)
        conf = str(d / "slurm.conf")
        self._spawn([_which("slurmctld"), "-D", "-c", "-f", conf])
        self._spawn([_which("slurmd"), "-D", "-f", conf, "-N", self.node])
        deadline = time.monotonic() + timeout_s
        while True:
            state = self._run("sinfo", "-h", "-o", "%t", check=False).strip()
            if state in ("idle", "mix", "alloc"):
                break
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise RuntimeError(
                    f"Slurm did not come up in {timeout_s} s (node state {state!r}); logs in {d}"
                )
            time.sleep(0.3)
        if self.accounting:
            self._seed_accounting()
        if self.rest:
            self._start_rest(timeout_s)

    def _slurm_conf(self) -> str:
        d = self.dir
        if self.accounting:
            accounting = f"""AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={self.port.slurmdbd}
AccountingStoragePass={self.dir / "munge.sock"}
AccountingStorageEnforce=associations,limits,qos
AccountingStorageTRES=gres/gpu
# A portal project is the job's --wckey; sacct and sreport report by it.
TrackWCKey=yes
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
PriorityType=priority/multifactor
PriorityWeightQOS=10000
PriorityWeightFairshare=1000
"""
        else:
            accounting = "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
        return f"""ClusterName={self.cluster_name}
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={self.port.slurmctld}
SlurmdPort={self.port.slurmd}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d / "munge.sock"}
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key={self.jwt_key}
CredType=cred/munge
StateSaveLocation={d / "state"}
SlurmdSpoolDir={d / "spool"}
SlurmctldPidFile={d / "slurmctld.pid"}
SlurmdPidFile={d / "slurmd.pid"}
SlurmctldLogFile={d / "slurmctld.log"}
SlurmdLogFile={d / "slurmd.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
# Tuned for latency, the stronger anchor: batch jobs are otherwise held up to 3 s.
SchedulerParameters=batch_sched_delay=0,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
{accounting}MaxArraySize=100001
MaxJobCount=200000
MinJobAge=600
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=1000 Gres={self.node_gres()} State=UNKNOWN
PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

    def node_gres(self) -> str:
        """The node's ``Gres=`` in slurm.conf: ``gpu:4``, or ``gpu:a100:2,gpu:l40s:2`` when typed."""
        if self.gpu_types:
            return ",".join(f"gpu:{kind}:{n}" for kind, n in self.gpu_types)
        return f"gpu:{self.gpus}"

    def _start_accounting(self, timeout_s: float) -> None:
        d = self.dir
        datadir = d / "mariadb"
        subprocess.run(
            [
                _which("mariadb-install-db"),
                "--no-defaults",
                f"--datadir={datadir}",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            check=True,
            capture_output=True,
        )
        # No grant tables: the database is private to this directory and bound to 127.0.0.1.
        self._spawn(
            [
                _which("mariadbd"),
                "--no-defaults",
                f"--datadir={datadir}",
                f"--socket={d / 'mariadb.sock'}",
                f"--port={self.port.mariadb}",
                "--bind-address=127.0.0.1",
                f"--pid-file={d / 'mariadb.pid'}",
                "--user=root",
                "--skip-grant-tables",
                "--innodb-buffer-pool-size=64M",
                "--innodb-flush-log-at-trx-commit=0",
                f"--log-error={d / 'mariadb.err'}",
            ]
        )
        self._wait_for_port(self.port.mariadb, timeout_s, "MariaDB")
        conf = d / "slurmdbd.conf"
        conf.write_text(
            f"""AuthType=auth/munge
AuthInfo=socket={d / "munge.sock"}
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key={self.jwt_key}
DbdHost={self.node}
DbdAddr=127.0.0.1
DbdPort={self.port.slurmdbd}
SlurmUser=root
PidFile={d / "slurmdbd.pid"}
LogFile={d / "slurmdbd.log"}
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={self.port.mariadb}
StorageUser=root
StorageLoc=slurm_acct_db
TrackWCKey=yes
"""
        )
        conf.chmod(0o600)
        # slurmdbd reads slurmdbd.conf next to $SLURM_CONF.
        self._spawn([_which("slurmdbd"), "-D"])
        self._wait_for_port(self.port.slurmdbd, timeout_s, "slurmdbd")

    def _seed_accounting(self) -> None:
        """The cluster, account ``lab`` and the queues' QOS, as a lab's Slurm admin would have them."""
        self.sacctmgr("add", "qos", "high", "Priority=1000", check=False)
        self.sacctmgr("add", "qos", "debug", "Priority=500", check=False)
        self.sacctmgr("add", "account", "lab", f"cluster={self.cluster_name}", check=False)
        self.add_user("root", qos=("normal", "high", "debug"))

    def add_user(
        self, unix_name: str, *, account: str = "lab", qos: tuple[str, ...] = ("normal", "debug")
    ) -> None:
        """An association for ``unix_name`` in ``account`` with access to ``qos`` (default the first)."""
        self.sacctmgr(
            "add",
            "user",
            unix_name,
            f"account={account}",
            f"cluster={self.cluster_name}",
            f"qos={','.join(qos)}",
            f"defaultqos={qos[0]}",
            check=False,
        )
        self.sacctmgr(
            "modify",
            "user",
            unix_name,
            "set",
            f"qos={','.join(qos)}",
            f"defaultqos={qos[0]}",
        )

    def sacctmgr(self, *argv: str, check: bool = True) -> str:
        return self._run("sacctmgr", "-i", *argv, check=check)

    def _start_rest(self, timeout_s: float) -> None:
        # slurmrestd refuses to run as root or SlurmUser: it runs as nobody and only
        # forwards each request's JWT to slurmctld.
        nobody = pwd.getpwnam("nobody")
        self._spawn(
            [
                _which("slurmrestd"),
                "-f",
                str(self.dir / "slurm.conf"),
                "-a",
                "rest_auth/jwt",
                # The accounting endpoints only where there is accounting to serve.
                "-s",
                "openapi/v0.0.38,openapi/dbv0.0.38" if self.accounting else "openapi/v0.0.38",
                "-u",
                str(nobody.pw_uid),
                "-g",
                str(nobody.pw_gid),
                f"127.0.0.1:{self.port.slurmrestd}",
            ],
            extra_env={"SLURM_JWT": "daemon"},
        )
        self._wait_for_port(self.port.slurmrestd, timeout_s, "slurmrestd")

    def _spawn(self, argv: list[str], extra_env: dict[str, str] | None = None) -> None:
        log = (self.dir / (Path(argv[0]).name + ".out")).open("wb")
        self.procs.append(
            subprocess.Popen(
                argv,
                env={**self.env, **(extra_env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    def _wait_for_port(self, port: int, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            dead = [p for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not come up on port {port}; logs in {self.dir}")
            time.sleep(0.2)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._run("scancel", f"--partition={self.partition}", check=False)
        # In reverse: slurmrestd, slurmd and slurmctld before slurmdbd before MariaDB.
        for proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        pid_file = self.dir / "munged.pid"
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
        time.sleep(0.5)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _run(self, *argv: str, check: bool = True) -> str:
        done = subprocess.run(
            [str(_which(argv[0])), *argv[1:]],
            env=self.env,
            # Jobs start in sbatch's working directory: our own, which every member's
            # unix user may enter (the caller's may not be: a home, a private checkout).
            cwd=self.dir,
            capture_output=True,
            text=True,
            check=False,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
        return done.stdout

    def run_as(self, unix_name: str, *argv: str, check: bool = True) -> str:
        """A Slurm command run as ``unix_name`` (as a member would at a login node)."""
        return self._run(_which("runuser"), "-u", unix_name, "--", *argv, check=check)

    def queue_empty(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self._run("squeue", "-h", "-o", "%i").strip():
            if time.monotonic() > deadline:
                raise RuntimeError("Slurm jobs still queued after the bench's wait")
            time.sleep(0.2)

    # -- the workloads -----------------------------------------------------------

    def submit_rate(self, count: int, clients: int) -> float:
        """Jobs accepted per second by ``sbatch`` (held, so none runs meanwhile)."""
        per_client = [count // clients + (1 if i < count % clients else 0) for i in range(clients)]
        errors: list[str] = []

        def work(n: int) -> None:
            for _ in range(n):
                try:
                    self._run("sbatch", "--hold", "--gres=gpu:1", "-o", "/dev/null", "--wrap=true")
                except RuntimeError as exc:
                    errors.append(str(exc))

        threads = [threading.Thread(target=work, args=(n,)) for n in per_client]
        began = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - began
        self._cancel_all()
        if errors:
            raise RuntimeError(f"sbatch failed: {errors[:2]}")
        return count / elapsed

    def array_submit_rate(self, arrays: int, size: int) -> float:
        """Jobs accepted per second by ``arrays`` held ``sbatch --array`` jobs of ``size``
        tasks, one client: the anchor for the portal's batch submit."""
        began = time.perf_counter()
        for _ in range(arrays):
            self._run(
                "sbatch",
                "--hold",
                f"--array=0-{size - 1}",
                "--gres=gpu:1",
                "-o",
                "/dev/null",
                "--wrap=true",
            )
        elapsed = time.perf_counter() - began
        self._cancel_all()
        return arrays * size / elapsed

    def _cancel_all(self) -> None:
        """Cancel every job of the partition (the submit rates hold theirs) and wait for none."""
        self._run("scancel", f"--partition={self.partition}", check=False)
        self.queue_empty(60)

    def submit_to_running(self, count: int) -> list[float]:
        """Seconds from ``sbatch`` to the job's first instruction, one job at a time on an idle node."""
        waits = []
        marks = self.dir / "marks"
        marks.mkdir(exist_ok=True)
        for i in range(count):
            mark = marks / f"start-{i}"
            began = time.time()
            self._run(
                "sbatch",
                "--gres=gpu:1",
                "-o",
                "/dev/null",
                f"--wrap=date +%s.%N > {mark}.tmp && mv {mark}.tmp {mark}; sleep 0.5",
            )
            deadline = time.monotonic() + 60
            while not mark.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError("a Slurm job did not start within 60 s")
                time.sleep(0.01)
            waits.append(float(mark.read_text()) - began)
        self.queue_empty(60)
        return waits

    def makespan(self, jobs: int, seconds: float) -> dict[str, Any]:
        """``jobs`` jobs of ``sleep seconds`` as one job array, 1 GPU each: first submit to last end."""
        ends = self.dir / "ends"
        began = time.time()
        self._run(
            "sbatch",
            f"--array=0-{jobs - 1}",
            "--gres=gpu:1",
            "-o",
            "/dev/null",
            f"--wrap=sleep {seconds}; date +%s.%N >> {ends}",
        )
        deadline = time.monotonic() + jobs * seconds * 5 + 120
        while True:
            done = ends.read_text().split() if ends.exists() else []
            if len(done) >= jobs:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(done)} of {jobs} Slurm jobs ended in time")
            time.sleep(0.25)
        self.queue_empty(60)
        return {"makespan_s": max(float(x) for x in done) - began, "jobs": len(done)}


def summary(waits: list[float]) -> dict[str, float]:
    ordered = sorted(waits)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return {
        "p50_s": round(statistics.median(ordered), 3),
        "p95_s": round(p95, 3),
        "max_s": round(ordered[-1], 3),
    }

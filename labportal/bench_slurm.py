"""A private Slurm for `make bench`: the anchor each portal figure is compared against.

When Debian's Slurm is installed (`apt-get install slurm-wlm`), ``LocalSlurm``
starts munged, slurmctld and slurmd in a temporary directory, with one node of
``gpus`` GPUs (GRES backed by links to /dev/null: Slurm counts and hands them
out, nothing uses them) and the given ports, runs the same workloads the
portal runs, and stops everything again. Nothing outside that directory is
touched. Without Slurm, ``LocalSlurm.missing()`` says why and the bench prints
"not measured".
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")


def _which(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(p) for d in ("/usr/sbin", "/sbin") if (p := Path(d) / name).exists()), None
    )


class LocalSlurm:
    """munged + slurmctld + slurmd on this host, one node with ``gpus`` GPUs."""

    def __init__(self, *, gpus: int = 4, cpus: int = 16, ports: tuple[int, int] = (8801, 8802)):
        self.gpus = gpus
        self.cpus = cpus
        self.ports = ports
        self.dir = Path(tempfile.mkdtemp(prefix="labportal-bench-slurm-"))
        self.node = socket.gethostname().split(".")[0]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.dir / "slurm.conf")}

    @staticmethod
    def missing() -> str | None:
        """Why Slurm cannot run here, or None."""
        absent = [b for b in BINARIES if _which(b) is None]
        if absent:
            return "Slurm is not installed (apt-get install slurm-wlm): no " + ", ".join(absent)
        if os.geteuid() != 0:
            return "starting a private Slurm needs root (slurmd runs jobs as their users)"
        return None

    # -- life cycle ----------------------------------------------------------

    def start(self, timeout_s: float = 60) -> None:
        d = self.dir
        for sub in ("state", "spool"):
            (d / sub).mkdir()
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
        devices = []
        for i in range(self.gpus):
            link = d / f"gpu{i}"
            link.symlink_to("/dev/null")  # a character device: Slurm accepts it as a GPU file
            devices.append(str(link))
        (d / "gres.conf").write_text(
            "".join(f"NodeName={self.node} Name=gpu File={path}\n" for path in devices)
        )
        ctld_port, d_port = self.ports
        (d / "slurm.conf").write_text(
            f"""ClusterName=lpbench
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d / "munge.sock"}
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
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MaxArraySize=100001
MaxJobCount=200000
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=1000 Gres=gpu:{self.gpus} State=UNKNOWN
PartitionName=bench Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        )
        conf = str(d / "slurm.conf")
        for argv in (
            [_which("slurmctld"), "-D", "-c", "-f", conf],
            [_which("slurmd"), "-D", "-f", conf, "-N", self.node],
        ):
            log = (d / (Path(str(argv[0])).name + ".out")).open("wb")
            self.procs.append(
                subprocess.Popen(
                    [str(a) for a in argv],
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + timeout_s
        while True:
            state = self._run("sinfo", "-h", "-o", "%t", check=False).strip()
            if state in ("idle", "mix", "alloc"):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm did not come up in {timeout_s} s (node state {state!r})")
            time.sleep(0.3)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._run("scancel", "--partition=bench", check=False)
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        pid_file = self.dir / "munged.pid"
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
        time.sleep(0.5)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _run(self, *argv: str, check: bool = True) -> str:
        done = subprocess.run(
            [str(_which(argv[0])), *argv[1:]],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
        return done.stdout

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
        self._run("scancel", "--partition=bench", check=False)
        self.queue_empty(60)
        if errors:
            raise RuntimeError(f"sbatch failed: {errors[:2]}")
        return count / elapsed

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

"""The alert rules: each reads the cluster's state and the readings and returns what it finds.

A rule returns `Finding`s; `alerts.services.alerts_evaluate` turns them into alerts
(one open alert per kind and subject), resolves the alerts whose condition ended,
and takes each rule's action after its warning and grace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F

from alerts.models import AlertRule, Kind, QueueAlertPolicy
from alerts.readings import GpuWindow, LatestSample, gpu_latest_samples, gpu_windows
from cluster.models import Gpu, Node
from jobqueue.models import Allocation, Job
from sessions.status import SessionStatus, session_status

# A GPU whose newest sample is older than this is not judged on memory or processes.
FRESH_SAMPLE_S = 120
# A process of a job that ended this long ago is a zombie.
ZOMBIE_AFTER_S = 30
# Stop and requeue always give the owner at least this long after the warning.
MIN_WARNING_BEFORE_STOP_S = 5 * 60


@dataclass(frozen=True)
class Finding:
    kind: str
    subject: str
    params: dict[str, Any]
    severity: str = "warning"
    job_id: int | None = None
    user_id: int | None = None
    gpu_id: int | None = None
    node_id: int | None = None
    # Idle jobs: what the queue does after the grace, and how long the grace is.
    action: str = ""
    grace_s: int = 0


@dataclass(frozen=True, slots=True)
class GpuRow:
    """What the rules need of a `cluster.Gpu`, read as plain values (thousands per evaluation)."""

    pk: int
    kind: str
    parent_id: int | None
    node_id: int
    node_name: str
    index: int
    uuid: str
    memory_mb: int
    shared_slots: int

    @property
    def label(self) -> str:
        if self.kind == Gpu.Kind.WHOLE:
            return f"{self.node_name}/gpu{self.index}"
        return f"{self.node_name}/gpu{self.index}/{self.kind}-{self.uuid[-4:]}"


@dataclass(frozen=True, slots=True)
class JobRow:
    pk: int
    owner_id: int
    queue_id: int
    node_id: int | None
    started_at: datetime | None


@dataclass
class Cluster:
    """What every rule needs, read once per evaluation."""

    now: datetime
    rules: dict[str, AlertRule]
    gpus: dict[int, GpuRow]
    running: list[JobRow]
    # job id -> the units it holds (a slot's physical GPU is `physical(unit)`)
    job_units: dict[int, list[GpuRow]] = field(default_factory=dict)
    busy_physical: set[int] = field(default_factory=set)
    recently_released: set[int] = field(default_factory=set)
    latest: dict[int, LatestSample] = field(default_factory=dict)
    policies: dict[int, QueueAlertPolicy] = field(default_factory=dict)
    _windows: dict[int, dict[int, GpuWindow]] = field(default_factory=dict)

    def windows(self, seconds: int) -> dict[int, GpuWindow]:
        if seconds not in self._windows:  # a window not announced to `prefetch`
            self.prefetch(
                [(seconds, "util"), (seconds, "mem"), (seconds, "temp"), (seconds, "errors")]
            )
        return self._windows[seconds]

    def prefetch(self, wanted: list[tuple[int, str]]) -> None:
        """Read every window the rules will ask for, with only the metrics each needs, in one scan."""
        groups: dict[int, set[str]] = {}
        for seconds, group in wanted:
            groups.setdefault(seconds, set()).add(group)
        starts = {seconds: self.now - timedelta(seconds=seconds) for seconds in groups}
        read = gpu_windows(
            since={starts[seconds]: g for seconds, g in groups.items()}, now=self.now
        )
        for seconds, start in starts.items():
            self._windows[seconds] = read.get(start, {})

    def physical(self, gpu: GpuRow) -> GpuRow:
        return (
            self.gpus.get(gpu.parent_id, gpu)
            if gpu.kind == Gpu.Kind.SLOT and gpu.parent_id
            else gpu
        )


def cluster_read(*, now: datetime) -> Cluster:
    rules = AlertRule.effective()
    gpus = {
        row["pk"]: GpuRow(**row)
        for row in Gpu.objects.exclude(state=Gpu.State.MISSING).values(
            "pk",
            "kind",
            "parent_id",
            "node_id",
            "index",
            "uuid",
            "memory_mb",
            "shared_slots",
            node_name=F("node__name"),
        )
    }
    running = [
        JobRow(**row)
        for row in Job.objects.filter(state=Job.State.RUNNING, started_at__isnull=False).values(
            "pk", "owner_id", "queue_id", "node_id", "started_at"
        )
    ]
    cluster = Cluster(now=now, rules=rules, gpus=gpus, running=running)
    for job_id, gpu_id in Allocation.objects.filter(active=True).values_list("job_id", "gpu_id"):
        gpu = gpus.get(gpu_id)
        if gpu is None:
            continue
        cluster.job_units.setdefault(job_id, []).append(gpu)
        cluster.busy_physical.add(cluster.physical(gpu).pk)
    leak_window = timedelta(seconds=rules[Kind.MEMORY_LEAK].window_s)
    cluster.recently_released = {
        cluster.physical(gpus[gpu_id]).pk
        for gpu_id in Allocation.objects.filter(
            active=False, released_at__gte=now - leak_window
        ).values_list("gpu_id", flat=True)
        if gpu_id in gpus
    }
    cluster.latest = gpu_latest_samples(since=now - timedelta(seconds=FRESH_SAMPLE_S))
    cluster.policies = {p.queue_id: p for p in QueueAlertPolicy.objects.all()}
    idle_windows = {rules[Kind.IDLE_JOB].window_s, rules[Kind.IDLE_SESSION].window_s} | {
        p.idle_window_s for p in cluster.policies.values() if p.idle_window_s is not None
    }
    cluster.prefetch(
        [
            *((seconds, "util") for seconds in idle_windows),
            (rules[Kind.MEMORY_LEAK].window_s, "mem"),
            (hot_window_s(rules[Kind.GPU_HOT]), "temp"),
            (errors_window_s(rules[Kind.GPU_ERRORS]), "errors"),
        ]
    )
    return cluster


def _label(gpu: GpuRow) -> str:
    return gpu.label


# --- idle jobs -------------------------------------------------------------------


def idle_jobs(cluster: Cluster) -> list[Finding]:
    """Running jobs whose every GPU stayed under the threshold for the whole window."""
    rule = cluster.rules[Kind.IDLE_JOB]
    findings = []
    for job in cluster.running:
        policy = cluster.policies.get(job.queue_id)
        threshold = _pick(policy.idle_threshold_pct if policy else None, rule.threshold)
        window_s = int(_pick(policy.idle_window_s if policy else None, rule.window_s))
        grace_s = int(_pick(policy.idle_grace_s if policy else None, rule.grace_s))
        action = policy.idle_action if policy else QueueAlertPolicy.Action.WARN
        if action in (QueueAlertPolicy.Action.STOP, QueueAlertPolicy.Action.REQUEUE):
            grace_s = max(grace_s, MIN_WARNING_BEFORE_STOP_S)
        since = cluster.now - timedelta(seconds=window_s)
        if job.started_at is None or job.started_at > since:
            continue  # not running long enough to judge
        units = cluster.job_units.get(job.pk, [])
        physical = {cluster.physical(g).pk for g in units}
        if not physical:
            continue
        windows = cluster.windows(window_s)
        readings = [windows.get(gpu_id) for gpu_id in physical]
        if any(not _covers(w, since, window_s) for w in readings):
            continue  # no data, or not enough of it: never accuse a job on a gap
        peak = max(w.max_util or 0.0 for w in readings if w is not None)
        if peak >= threshold:
            continue
        findings.append(
            Finding(
                kind=Kind.IDLE_JOB,
                subject=f"job:{job.pk}",
                params={
                    "job_id": job.pk,
                    "threshold": _num(threshold),
                    "minutes": max(1, round(window_s / 60)),
                    "util": _num(peak),
                    "action": action,
                    "grace_min": max(1, round(grace_s / 60)),
                },
                job_id=job.pk,
                user_id=job.owner_id,
                node_id=job.node_id,
                action=action,
                grace_s=grace_s,
            )
        )
    return findings


def _covers(window: GpuWindow | None, since: datetime, window_s: int) -> bool:
    if window is None or window.samples < 2:
        return False
    # The samples must span most of the window (an agent that was away leaves a gap).
    return (window.last_ts - window.first_ts).total_seconds() >= 0.8 * window_s


# --- GPU memory ------------------------------------------------------------------


def memory_high(cluster: Cluster) -> list[Finding]:
    """Running jobs above the threshold of their GPUs' memory, or of their share of a shared GPU."""
    rule = cluster.rules[Kind.MEMORY_HIGH]
    findings = []
    for job in cluster.running:
        worst: tuple[float, int, int, GpuRow] | None = None
        for unit in cluster.job_units.get(job.pk, []):
            parent = cluster.physical(unit)
            latest = cluster.latest.get(parent.pk)
            if latest is None:
                continue
            total = latest.mem_total_mb or parent.memory_mb
            if unit.kind == Gpu.Kind.SLOT:
                limit = total // max(1, parent.shared_slots)
                used = sum(
                    p.get("used_mb") or 0 for p in latest.processes if p.get("job_id") == job.pk
                )
            else:
                limit = total
                used = latest.mem_used_mb or 0
            if limit <= 0:
                continue
            pct = 100.0 * used / limit
            if worst is None or pct > worst[0]:
                worst = (pct, used, limit, unit)
        if worst is not None and worst[0] >= rule.threshold:
            pct, used, limit, unit = worst
            findings.append(
                Finding(
                    kind=Kind.MEMORY_HIGH,
                    subject=f"job:{job.pk}",
                    params={
                        "job_id": job.pk,
                        "used_mb": used,
                        "limit_mb": limit,
                        "pct": _num(pct),
                        "gpu": _label(unit),
                    },
                    job_id=job.pk,
                    user_id=job.owner_id,
                    gpu_id=unit.pk,
                    node_id=job.node_id,
                )
            )
    return findings


def memory_leaks(cluster: Cluster, ended_jobs: dict[int, datetime]) -> list[Finding]:
    """GPU memory held with no job on the GPU, or held by processes of jobs that have ended."""
    rule = cluster.rules[Kind.MEMORY_LEAK]
    windows = cluster.windows(rule.window_s)
    # A job that ended moments ago may still show in a sample taken before its end.
    zombie_before = cluster.now - timedelta(seconds=ZOMBIE_AFTER_S)
    findings = []
    for gpu_id, latest in cluster.latest.items():
        gpu = cluster.gpus.get(gpu_id)
        if gpu is None or gpu.kind == Gpu.Kind.SLOT:
            continue
        of_ended = [p for p in latest.processes if p.get("job_id") in ended_jobs]
        zombies = [p for p in of_ended if ended_jobs[int(p["job_id"])] < zombie_before]
        zombie_mb = sum(p.get("used_mb") or 0 for p in zombies)
        window = windows.get(gpu_id)
        idle_held = (
            gpu_id not in cluster.busy_physical
            and gpu_id not in cluster.recently_released
            and window is not None
            and _covers(window, cluster.now - timedelta(seconds=rule.window_s), rule.window_s)
            and (window.min_mem_mb or 0) >= rule.threshold
            and not any(p.get("job_id") is None for p in latest.processes)  # strays: own rule
        )
        if not (idle_held or (zombies and zombie_mb >= rule.threshold)):
            continue
        if idle_held:
            # Nothing of a live job is here: every ended job's process on it is a zombie.
            zombies = of_ended
        held = (latest.mem_used_mb or 0) if idle_held else zombie_mb
        findings.append(
            Finding(
                kind=Kind.MEMORY_LEAK,
                subject=f"gpu:{gpu.pk}",
                severity="critical",
                params={
                    "gpu": _label(gpu),
                    "used_mb": held,
                    "job_ids": sorted({int(p["job_id"]) for p in zombies}),
                    "pids": sorted(int(p["pid"]) for p in zombies),
                    "reset": f"ssh {gpu.node_name} nvidia-smi --gpu-reset -i {gpu.index}",
                },
                gpu_id=gpu.pk,
                node_id=gpu.node_id,
                grace_s=rule.grace_s,
            )
        )
    return findings


def stray_processes(cluster: Cluster) -> list[Finding]:
    """Processes on a GPU that belong to no job: someone bypassing the queue."""
    findings = []
    for gpu_id, latest in cluster.latest.items():
        gpu = cluster.gpus.get(gpu_id)
        if gpu is None:
            continue
        for process in latest.processes:
            if any(process.get(k) is not None for k in ("job_id", "container_id", "slurm_job_id")):
                continue  # a portal job's, a container's, or a Slurm job's (Slurm mode)
            findings.append(
                Finding(
                    kind=Kind.STRAY_PROCESS,
                    subject=f"gpu:{gpu.pk}:pid:{process['pid']}",
                    params={
                        "gpu": _label(gpu),
                        "pid": process["pid"],
                        "unix_user": process.get("unix_user") or "?",
                        "used_mb": process.get("used_mb") or 0,
                    },
                    gpu_id=gpu.pk,
                    node_id=gpu.node_id,
                )
            )
    return findings


# --- hardware and nodes ------------------------------------------------------------


def hot_gpus(cluster: Cluster) -> list[Finding]:
    """GPUs above the temperature threshold for the whole window."""
    rule = cluster.rules[Kind.GPU_HOT]
    window_s = hot_window_s(rule)
    findings = []
    for gpu_id, window in cluster.windows(window_s).items():
        gpu = cluster.gpus.get(gpu_id)
        if gpu is None or window.min_temp_c is None or window.min_temp_c < rule.threshold:
            continue
        if not _covers(window, cluster.now - timedelta(seconds=window_s), window_s):
            continue
        findings.append(
            Finding(
                kind=Kind.GPU_HOT,
                subject=f"gpu:{gpu.pk}",
                severity="critical",
                params={
                    "gpu": _label(gpu),
                    "temp": _num(window.max_temp_c or 0),
                    "threshold": _num(rule.threshold),
                },
                gpu_id=gpu.pk,
                node_id=gpu.node_id,
            )
        )
    return findings


ERRORS_WINDOW_S = 15 * 60


def hot_window_s(rule: AlertRule) -> int:
    return max(rule.window_s, 30)


def errors_window_s(rule: AlertRule) -> int:
    return max(rule.window_s, ERRORS_WINDOW_S)


def gpu_errors(cluster: Cluster) -> list[Finding]:
    """New ECC or XID errors (the counters grew) within the last window."""
    rule = cluster.rules[Kind.GPU_ERRORS]
    window_s = errors_window_s(rule)
    findings = []
    for gpu_id, window in cluster.windows(window_s).items():
        gpu = cluster.gpus.get(gpu_id)
        if gpu is None:
            continue
        ecc = (window.ecc_high or 0) - (window.ecc_low or 0)
        xid = (window.xid_high or 0) - (window.xid_low or 0)
        if ecc + xid < max(1.0, rule.threshold):
            continue
        findings.append(
            Finding(
                kind=Kind.GPU_ERRORS,
                subject=f"gpu:{gpu.pk}",
                severity="critical",
                params={"gpu": _label(gpu), "ecc": ecc, "xid": xid},
                gpu_id=gpu.pk,
                node_id=gpu.node_id,
            )
        )
    return findings


def silent_nodes(cluster: Cluster) -> list[Finding]:
    """Registered nodes that sent no heartbeat within the down timeout."""
    cutoff = cluster.now - timedelta(seconds=settings.LABPORTAL_NODE_DOWN_AFTER_S)
    findings = []
    silent = Node.objects.filter(registered_at__isnull=False).filter(
        last_heartbeat__lt=cutoff
    ) | Node.objects.filter(registered_at__isnull=False, state=Node.State.DOWN)
    for node in silent.distinct():
        since = node.last_heartbeat
        findings.append(
            Finding(
                kind=Kind.NODE_SILENT,
                subject=f"node:{node.pk}",
                severity="critical",
                params={
                    "node": node.name,
                    "since": since.strftime("%Y-%m-%d %H:%M UTC") if since else "?",
                },
                node_id=node.pk,
            )
        )
    return findings


def ended_jobs_in(cluster: Cluster) -> dict[int, datetime]:
    """Jobs named by processes on the GPUs that have ended, with when they ended."""
    named = {
        int(p["job_id"])
        for latest in cluster.latest.values()
        for p in latest.processes
        if p.get("job_id") is not None
    }
    if not named:
        return {}
    rows = Job.objects.filter(pk__in=named, state__in=Job.FINAL_STATES).values_list(
        "pk", "ended_at"
    )
    return {pk: ended_at or cluster.now for pk, ended_at in rows}


def _pick(value: float | int | None, default: float | int) -> float:
    return float(default if value is None else value)


def _num(value: float) -> float | int:
    rounded = round(value, 1)
    return int(rounded) if rounded == int(rounded) else rounded


def _gpus_worked(cluster: Cluster, job_id: int, *, window_s: int, threshold: float) -> bool:
    """Whether any GPU of the job reached ``threshold`` % within the last ``window_s``."""
    physical = {cluster.physical(g).pk for g in cluster.job_units.get(job_id, [])}
    windows = cluster.windows(window_s)
    return any(
        (w := windows.get(gpu_id)) is not None and (w.max_util or 0.0) >= threshold
        for gpu_id in physical
    )


# Who the gateway's log names for the culler's probes.
CULLER = "idle-culler"


def session_statuses(cluster: Cluster) -> dict[int, tuple[Job, SessionStatus]]:
    """Each running session's state as its gateway reports it (one probe each)."""
    sessions = Job.objects.filter(state=Job.State.RUNNING).exclude(kind=Job.Kind.BATCH)
    return {
        job.pk: (job, session_status(job, username=CULLER))
        for job in sessions.select_related("node")
    }


def idle_sessions(
    cluster: Cluster, statuses: dict[int, tuple[Job, SessionStatus]]
) -> list[Finding]:
    """Running sessions nobody used for the rule's window, as JupyterHub's idle culler
    judges a server: nothing through the proxy (no request, no WebSocket frame, no key
    typed: the gateway's account), and for JupyterLab nothing in the server's own
    account either (its last activity, which counts kernel output; a busy kernel is use
    now). A session whose GPUs worked above the idle-GPU rule's threshold within the
    window is in use too: the same measure as the idle-GPU alert, so a notebook that
    trains quietly is never culled while one that holds its GPUs idle is.

    A session whose gateway did not answer is not judged: never accuse on a gap.
    """
    rule = cluster.rules[Kind.IDLE_SESSION]
    gpu_threshold = cluster.rules[Kind.IDLE_JOB].threshold
    findings = []
    for job, status in statuses.values():
        if status.problem or job.started_at is None or status.busy:
            continue
        last = (
            datetime.fromtimestamp(status.last_activity, tz=cluster.now.tzinfo)
            if status.last_activity is not None
            else job.started_at
        )
        idle_s = (cluster.now - max(last, job.started_at)).total_seconds()
        if idle_s < rule.window_s:
            continue
        if _gpus_worked(cluster, job.pk, window_s=int(rule.window_s), threshold=gpu_threshold):
            continue
        grace_s = max(int(rule.grace_s), MIN_WARNING_BEFORE_STOP_S)
        findings.append(
            Finding(
                kind=Kind.IDLE_SESSION,
                subject=f"job:{job.pk}",
                params={
                    "job_id": job.pk,
                    "minutes": max(1, round(idle_s / 60)),
                    "grace_min": max(1, round(grace_s / 60)),
                },
                job_id=job.pk,
                user_id=job.owner_id,
                node_id=job.node_id,
                action=QueueAlertPolicy.Action.STOP,
                grace_s=grace_s,
            )
        )
    return findings

"""What-if replays: the lab's own jobs of a period, run again through the scheduler simulator.

The jobs (submit time, size, queue, owner, time limit and the run time they really
had) come from the database; the cluster is the lab's GPUs, plus or minus N GPUs of
one model; the policy is the admin's, optionally changed. `scheduler.simulate`
replays each option with the same pure engine the portal schedules with.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

from django.utils.translation import gettext as _

from accounts.models import Category, User
from cluster.models import Gpu
from jobqueue.models import Job, Queue, SchedulingPolicy, command_text
from jobqueue.scheduling import engine_policy, engine_units, share_tree
from reports.errors import BadReplay
from reports.periods import Period
from reports.selectors import JobRow, WeekLine, percentile, unmet_demand, weeks_of
from scheduler import model as sm
from scheduler.predict import JobFeatures, command_shape
from scheduler.simulate import SimJob, Simulation, Workload

MAX_GPU_DELTA = 256
PER_ADDED_NODE = 8
# Policy fields staff may change in a replay, and the range each accepts.
POLICY_FIELDS: dict[str, tuple[float, float]] = {
    "weight_age": (0, 1e6),
    "weight_fairshare": (0, 1e6),
    "weight_queue": (0, 1e6),
    "weight_category": (0, 1e6),
    "weight_size": (0, 1e6),
}


@dataclass(frozen=True)
class ReplayOption:
    """One what-if: GPUs added (negative: removed) of a model, and policy changes."""

    label: str
    gpu_delta: int = 0
    gpu_model: str = ""
    policy_changes: dict[str, float] = field(default_factory=dict)


@dataclass
class ReplayOutcome:
    label: str
    gpus: int
    jobs: int
    wait_mean_h: float | None
    wait_p95_h: float | None
    utilisation_pct: float | None
    unmet_gpu_hours: float
    jain: float | None
    unfinished: int

    def as_dict(self) -> dict[str, Any]:
        def r(v: float | None, digits: int = 2) -> float | None:
            return None if v is None else round(v, digits)

        return {
            "label": self.label,
            "gpus": self.gpus,
            "jobs": self.jobs,
            "wait_mean_h": r(self.wait_mean_h),
            "wait_p95_h": r(self.wait_p95_h),
            "utilisation_pct": r(self.utilisation_pct, 1),
            "unmet_gpu_hours": r(self.unmet_gpu_hours, 1),
            "jain": r(self.jain, 3),
            "unfinished": self.unfinished,
        }


def _epoch(value: dt.datetime) -> float:
    return value.timestamp()


def workload_from_history(period: Period) -> tuple[Workload, list[SimJob]]:
    """The jobs that were submitted in the period and ran to an end, as simulator jobs;
    and the same jobs with the start and end they really had."""
    jobs = (
        Job.objects.filter(
            submitted_at__gte=period.start,
            submitted_at__lt=period.end,
            started_at__isnull=False,
            ended_at__isnull=False,
        )
        .order_by("submitted_at", "id")
        .values_list(
            "id",
            "owner__username",
            "owner__category__name",
            "queue__name",
            "gpus",
            "shared_slot",
            "submitted_at",
            "started_at",
            "ended_at",
            "time_limit_s",
            "preemptible",
            "gpu_model",
            "image__reference",
            "command",
        )
    )
    sim_jobs: list[SimJob] = []
    recorded: list[SimJob] = []
    for (
        _pk,
        user,
        category,
        queue,
        gpus,
        shared,
        submitted,
        started,
        ended,
        limit,
        preemptible,
        model,
        image,
        command,
    ) in jobs.iterator(chunk_size=5000):
        assert started is not None and ended is not None  # filtered above
        duration = max(1.0, (ended - started).total_seconds())
        sim_jobs.append(
            SimJob(
                index=len(sim_jobs),
                user=user,
                category=category or "",
                queue=queue,
                gpus=gpus,
                shared_slot=shared,
                submit=_epoch(submitted),
                duration=duration,
                # The limit it was accepted with: a job may run past it (warn, don't kill).
                time_limit=float(limit),
                preemptible=preemptible,
                features=JobFeatures(user, image, command_shape(command_text(command)), gpus),
                gpu_model=model or None,
            )
        )
        recorded.append(replace(sim_jobs[-1], start=_epoch(started), end=_epoch(ended)))
    if not sim_jobs:
        raise BadReplay(
            _("No job of this period ran to an end: choose a period with finished jobs to replay.")
        )
    users = sorted({j.user for j in sim_jobs})
    user_rows = list(User.objects.filter(username__in=users).select_related("category"))
    tree = share_tree(user_rows, list(Category.objects.all()))
    workload = Workload(sim_jobs, users, {u: 1 / len(users) for u in users}, tree)
    return workload, recorded


def lab_cluster(
    *, gpu_delta: int = 0, gpu_model: str = ""
) -> tuple[tuple[sm.Node, ...], tuple[sm.Gpu, ...]]:
    """The lab's schedulable GPUs; `gpu_delta` GPUs of `gpu_model` added on new nodes
    of PER_ADDED_NODE, or (negative) taken away, last nodes first."""
    rows = list(
        Gpu.objects.select_related("node", "parent")
        .exclude(state=Gpu.State.MISSING)
        .order_by("node__name", "index", "id")
    )
    units = engine_units(rows, rows)
    memory = {g.model: g.memory_mb for g in rows}
    if gpu_delta and gpu_model not in memory:
        raise BadReplay(
            _("The lab has no GPU of model “%(model)s”: pick one of %(models)s.")
            % {"model": gpu_model[:80], "models": ", ".join(sorted(memory)) or "—"}
        )
    if gpu_delta > 0:
        for i in range(gpu_delta):
            node = f"whatif-{i // PER_ADDED_NODE:02d}"
            units.append(
                sm.Gpu(f"{node}-gpu{i % PER_ADDED_NODE}", node, gpu_model, memory[gpu_model])
            )
    elif gpu_delta < 0:
        removable = [u for u in units if u.model == gpu_model and u.kind == sm.GpuKind.WHOLE]
        if -gpu_delta >= len(removable) and len(removable) == len(units):
            raise BadReplay(_("Removing that many GPUs leaves the lab with none: remove fewer."))
        if -gpu_delta > len(removable):
            raise BadReplay(
                _("The lab has only %(count)s whole GPUs of model “%(model)s” to remove.")
                % {"count": len(removable), "model": gpu_model}
            )
        gone = {u.id for u in removable[gpu_delta:]}
        units = [u for u in units if u.id not in gone]
    nodes = tuple(sm.Node(name) for name in sorted({u.node for u in units}))
    return nodes, tuple(units)


def lab_policy(changes: dict[str, float] | None = None) -> sm.Policy:
    """The admin's policy as the engine sees it, with `changes` applied."""
    policy = engine_policy(
        SchedulingPolicy.current(), list(Queue.objects.all()), list(Category.objects.all())
    )
    changes = dict(changes or {})
    for name, value in changes.items():
        low, high = POLICY_FIELDS.get(name, (None, None))
        if low is None or high is None:
            raise BadReplay(
                _("“%(name)s” is not a setting a replay can change; use one of %(names)s.")
                % {"name": name[:40], "names": ", ".join(POLICY_FIELDS)}
            )
        if not low <= value <= high:
            raise BadReplay(
                _("“%(name)s” must be between %(low)s and %(high)s.")
                % {"name": name, "low": low, "high": high}
            )
    return replace(policy, **cast(dict[str, Any], changes))


def _whole_units(units: tuple[sm.Gpu, ...]) -> int:
    return len({u.parent or u.id for u in units})


def _measure(
    label: str,
    jobs: list[SimJob],
    *,
    capacity: int,
    period: Period,
    jain: float | None = None,
    slots_per_gpu: int = 4,
) -> ReplayOutcome:
    """Waits, utilisation and unmet demand of jobs that have start and end times."""
    done = [j for j in jobs if j.start is not None and j.end is not None]
    t0, t1 = period.start.timestamp(), period.end.timestamp()
    waits: list[float] = []
    busy_h = 0.0
    rows = []
    for j in done:
        assert j.start is not None and j.end is not None
        units = (1 / slots_per_gpu) if j.shared_slot else float(j.gpus)
        waits.append((j.start - j.submit) / 3600)
        busy_h += units * max(0.0, min(j.end, t1) - max(j.start, t0)) / 3600
        rows.append(
            JobRow(
                j.index,
                j.user,
                j.category,
                j.queue,
                "",
                "",
                units,
                j.gpus,
                j.shared_slot,
                "",
                dt.datetime.fromtimestamp(j.submit, tz=dt.UTC),
                dt.datetime.fromtimestamp(j.start, tz=dt.UTC),
                dt.datetime.fromtimestamp(j.end, tz=dt.UTC),
            )
        )
    weeks = {monday: WeekLine(monday) for monday, _a, _b in weeks_of(period.start, period.end)}
    unmet_demand(rows, capacity, period.start, period.end, weeks)
    return ReplayOutcome(
        label=label,
        gpus=capacity,
        jobs=len(jobs),
        wait_mean_h=statistics.fmean(waits) if waits else None,
        wait_p95_h=percentile(waits, 95) if waits else None,
        utilisation_pct=100 * busy_h / (capacity * period.hours)
        if capacity and period.hours
        else None,
        unmet_gpu_hours=sum(w.unmet_gpu_hours for w in weeks.values()),
        jain=jain,
        unfinished=len(jobs) - len(done),
    )


def replay_options(
    *,
    period: Period,
    options: list[ReplayOption],
    progress: Callable[[int, int], None] | None = None,
) -> list[ReplayOutcome]:
    """Replay the period's jobs under each option; `progress(done, total)` after each."""
    workload, recorded = workload_from_history(period)
    outcomes = [
        _measure(
            _("Recorded history"),
            recorded,
            capacity=_whole_units(lab_cluster()[1]),
            period=period,
        )
    ]
    for done, option in enumerate(options):
        cluster = lab_cluster(gpu_delta=option.gpu_delta, gpu_model=option.gpu_model)
        sim = Simulation(
            workload,
            "labportal",
            gpus=_whole_units(cluster[1]),
            per_node=PER_ADDED_NODE,
            slot_gpus=0,
            slots_per_gpu=4,
            timeslot_s=4 * 3600.0,
            cluster=cluster,
            policy=lab_policy(option.policy_changes),
        )
        metrics = sim.run()
        outcomes.append(
            _measure(
                option.label,
                sim.jobs,
                capacity=_whole_units(cluster[1]),
                period=period,
                jain=metrics.get("jain"),
                slots_per_gpu=sim.slots_per_gpu,
            )
        )
        if progress is not None:
            progress(done + 1, len(options))
    return outcomes

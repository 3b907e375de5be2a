"""What-if replays: the lab's own jobs of a period, run again through the scheduler simulator.

The jobs (submit time, size, queue, owner, time limit and the run time they really
had) come from the database in one query; the cluster is the lab's GPUs, plus or minus
N GPUs of one model, optionally with more or fewer GPUs split into shared slots for
debug work; the policy is the admin's, optionally changed (priority weights, the
attained-service thresholds, queue limits, drain reserve). `scheduler.simulate` replays each option with the same pure
engine the portal schedules with.

The simulator knows neither bookings nor emergencies, so this layer brings them in
as the engine ranks them (see `scheduler.priority`):

- each booking (and maintenance window) of the period becomes a block job on its
  GPUs' model and node, for its booked window, in a queue ranked like a reservation
  job inside its window (tier rank 1); the jobs that ran inside the booking are its
  use of the block, so they are not replayed on their own. The block starts when its
  GPUs are free: the simulator does not keep GPUs free ahead of a booking as the live
  engine does, so a replay understates how much a booking delays the jobs before it.
- each job that had an approved emergency request runs in a queue ranked like an
  emergency (tier rank 0) without queue limits; the simulator does not preempt, so
  it waits for a free GPU where the live engine would requeue a preemptible job.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing
import os
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np
from django.core.exceptions import ValidationError
from django.db.models import Exists, OuterRef
from django.utils.functional import Promise
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from accounts.models import Category, User
from cluster.models import Gpu
from core.stats import percentile
from jobqueue.models import (
    EmergencyRequest,
    Job,
    Queue,
    SchedulingPolicy,
    parse_attained_thresholds,
)
from reports.errors import BadReplay
from reports.lines import WeekLine
from reports.periods import Period
from reports.weeks import unmet_demand, weeks_of
from reservations.models import Reservation
from scheduler import model as sm
from scheduler.predict import JobFeatures
from scheduler.simulate.run import Simulation
from scheduler.simulate.workload import SimJob, Workload
from scheduling.passes import engine_policy, engine_units, share_tree

MAX_GPU_DELTA = 256
PER_ADDED_NODE = 8
# Priority weights: the admin's scheduling policy, changed as they are.
WEIGHT_FIELDS: dict[str, Promise] = {
    "weight_age": gettext_lazy("weight: age"),
    "weight_fairshare": gettext_lazy("weight: fair share"),
    "weight_queue": gettext_lazy("weight: queue"),
    "weight_category": gettext_lazy("weight: category"),
    "weight_size": gettext_lazy("weight: job size"),
    "weight_attained": gettext_lazy("weight: least attained service"),
    "weight_short": gettext_lazy("weight: short jobs first"),
}
# The first least-attained-service threshold (GPUs held); the others scale with it, so
# a number (what the form and the API carry) changes the whole list, keeping its ratios.
ATTAINED_FIRST = "attained_first_threshold"
ATTAINED_FIRST_RANGE = (1.0, 10_000.0)
# Nodes the scheduler keeps draining for wide jobs (the scheduling policy's drain reserve).
DRAIN_RESERVE = "drain_reserve_nodes"
# Whole GPUs split into shared slots for debug work.
DEBUG_GPUS = "debug_gpus"
DEFAULT_DEBUG_SLOTS = 4
# Queue limits, as "queue:<name>:<limit>"; 0 means no limit where the queue allows none.
QUEUE_LIMITS: dict[str, tuple[float, float, Promise]] = {
    "max_gpus_per_job": (1, 64, gettext_lazy("max GPUs per job")),
    "max_time_limit_s": (60, 30 * 86400, gettext_lazy("max time limit (seconds)")),
    "max_running_jobs_per_user": (0, 10_000, gettext_lazy("max running jobs per user")),
    "max_running_gpus_per_user": (0, 10_000, gettext_lazy("max running GPUs per user")),
}
NULLABLE_QUEUE_LIMITS = ("max_running_jobs_per_user", "max_running_gpus_per_user")
# Tier ranks of the engine: 0 emergency, 1 reservation job in its window, 2 + queue tier.
EMERGENCY_QUEUE = "·emergency"
BOOKING_QUEUE = "·booking"


def queue_limit_knob(queue: str, limit: str) -> str:
    return f"queue:{queue}:{limit}"


def policy_knob_range(name: str) -> tuple[float, float]:
    """The values a replay accepts for the setting `name`; BadReplay for an unknown one."""
    if name in WEIGHT_FIELDS:
        return (0, 1e6)
    if name == ATTAINED_FIRST:
        return ATTAINED_FIRST_RANGE
    if name == DRAIN_RESERVE:
        return (0, 64)
    if name == DEBUG_GPUS:
        return (0, MAX_GPU_DELTA)
    kind, _sep, rest = name.partition(":")
    queue, _sep, limit = rest.partition(":")
    if kind == "queue" and limit in QUEUE_LIMITS and Queue.objects.filter(name=queue).exists():
        low, high, _label = QUEUE_LIMITS[limit]
        return (low, high)
    raise BadReplay(
        _(
            "“%(name)s” is not a setting a replay can change; use a priority weight "
            "(%(weights)s), %(attained)s, %(drain)s, %(debug)s or queue:<queue>:<limit> with "
            "a limit of %(limits)s."
        )
        % {
            "name": name[:60],
            "weights": ", ".join(WEIGHT_FIELDS),
            "attained": ATTAINED_FIRST,
            "drain": DRAIN_RESERVE,
            "debug": DEBUG_GPUS,
            "limits": ", ".join(QUEUE_LIMITS),
        }
    )


def policy_knob_check(name: str, value: float) -> None:
    low, high = policy_knob_range(name)
    if not low <= value <= high:
        raise BadReplay(
            _("“%(name)s” must be between %(low)s and %(high)s.")
            % {"name": name, "low": f"{low:g}", "high": f"{high:g}"}
        )
    if (name in (DRAIN_RESERVE, DEBUG_GPUS) or name.startswith("queue:")) and (value != int(value)):
        raise BadReplay(_("“%(name)s” must be a whole number.") % {"name": name})


def attained_thresholds_scaled(thresholds: tuple[float, ...], first: float) -> tuple[float, ...]:
    """`thresholds` scaled so that the first one is `first` (their ratios kept); BadReplay
    if a scaled threshold falls outside what the scheduling policy accepts."""
    scaled = tuple(round(t * first / thresholds[0], 3) for t in thresholds)
    try:
        return parse_attained_thresholds(attained_thresholds_text(scaled))
    except ValidationError as exc:
        raise BadReplay(" ".join(exc.messages)) from None


def attained_thresholds_text(thresholds: tuple[float, ...]) -> str:
    """The thresholds as the scheduling policy keeps them: "4, 8, 16"."""
    return ", ".join(f"{t:g}" for t in thresholds)


def policy_knobs() -> list[tuple[str, str, float | None]]:
    """(name, label, today's value) of every setting a replay can change, for the form."""
    current = SchedulingPolicy.current()
    knobs: list[tuple[str, str, float | None]] = [
        (name, str(label), getattr(current, name)) for name, label in WEIGHT_FIELDS.items()
    ]
    knobs.append(
        (
            ATTAINED_FIRST,
            _("Least attained service: first threshold (GPUs held; the others scale with it)"),
            current.attained_thresholds_gpus()[0],
        )
    )
    knobs.append(
        (DRAIN_RESERVE, _("Drain reserve (nodes kept for wide jobs)"), current.drain_reserve_nodes)
    )
    knobs.append((DEBUG_GPUS, _("GPUs split into shared slots for debug work"), None))
    for queue in Queue.objects.order_by("tier", "name"):
        for limit, (_low, _high, label) in QUEUE_LIMITS.items():
            knobs.append(
                (
                    queue_limit_knob(queue.name, limit),
                    f"{queue.name}: {label}",
                    getattr(queue, limit),
                )
            )
    return knobs


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
    allocation_pct: float | None  # GPU-hours held (jobs and bookings) / capacity
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
            "allocation_pct": r(self.allocation_pct, 1),
            "unmet_gpu_hours": r(self.unmet_gpu_hours, 1),
            "jain": r(self.jain, 3),
            "unfinished": self.unfinished,
        }


def _epoch(value: dt.datetime) -> float:
    return value.timestamp()


def _emergency_jobs() -> Any:
    """Jobs named in an emergency request that an admin approved (in force or expired since)."""
    return EmergencyRequest.jobs.through.objects.filter(
        job_id=OuterRef("pk"),
        emergencyrequest__state__in=[
            EmergencyRequest.State.APPROVED,
            EmergencyRequest.State.EXPIRED,
        ],
        emergencyrequest__decided_at__isnull=False,
    )


def _booking_blocks(period: Period) -> list[tuple[str, str, str, int, float, float]]:
    """(user, node, model, GPUs, start, end) per node of each booking and maintenance window
    that starts in the period, as they held GPUs (a released booking until its release)."""
    rows = (
        Reservation.objects.filter(start__gte=period.start, start__lt=period.end)
        .exclude(state=Reservation.State.CANCELLED)
        .order_by("start", "id")
        .values_list("id", "user__username", "start", "end", "gpus__node__name", "gpus__model")
    )
    per_node: Counter[tuple[int, str, str, str, float, float]] = Counter()
    for pk, user, start, end, node, model in rows:
        if node is not None and end > start:
            per_node[(pk, user, node, model or "", _epoch(start), _epoch(end))] += 1
    return [
        (user, node, model, n, start, end)
        for (_pk, user, node, model, start, end), n in per_node.items()
    ]


def workload_from_history(period: Period) -> tuple[Workload, list[SimJob]]:
    """The jobs that were submitted in the period and ran to an end, as simulator jobs,
    with the period's bookings as block jobs and emergencies in the emergency queue; and
    the same jobs with the start and end they really had. One query for all the jobs."""
    jobs = (
        Job.objects.filter(
            submitted_at__gte=period.start,
            submitted_at__lt=period.end,
            started_at__isnull=False,
            ended_at__isnull=False,
        )
        .annotate(emergency=Exists(_emergency_jobs()))
        .order_by("submitted_at", "id")
        .values_list(
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
            "command_shape_key",
            "emergency",
            "reservation_id",
            named=True,
        )
    )
    # (submit, kind, simulator job, recorded start, recorded end): kind 0 sorts a booking
    # block before the jobs submitted at its start.
    entries: list[tuple[float, int, SimJob, float, float]] = []
    replayed = 0
    for row in jobs.iterator(chunk_size=5000):
        started, ended = row.started_at, row.ended_at
        assert started is not None and ended is not None  # filtered above
        replayed += 1
        if row.reservation_id is not None:
            continue  # ran inside its booking: the booking's block stands for it
        duration = max(1.0, (ended - started).total_seconds())
        user = row.owner__username
        job = SimJob(
            index=0,
            user=user,
            category=row.owner__category__name or "",
            queue=EMERGENCY_QUEUE if row.emergency else row.queue__name,
            gpus=row.gpus,
            shared_slot=row.shared_slot,
            submit=_epoch(row.submitted_at),
            duration=duration,
            # The limit it was accepted with: a job may run past it (warn, don't kill).
            time_limit=float(row.time_limit_s),
            preemptible=row.preemptible,
            features=JobFeatures(user, row.image__reference, row.command_shape_key, row.gpus),
            gpu_model=row.gpu_model or None,
        )
        entries.append((job.submit, 1, job, _epoch(started), _epoch(ended)))
    if not replayed:
        raise BadReplay(
            _("No job of this period ran to an end: choose a period with finished jobs to replay.")
        )
    for user, node, model, n, start, end in _booking_blocks(period):
        block = SimJob(
            index=0,
            user=user,
            category="",
            queue=BOOKING_QUEUE,
            gpus=n,
            shared_slot=False,
            submit=start,
            duration=end - start,
            time_limit=end - start,
            preemptible=False,
            features=JobFeatures(user, BOOKING_QUEUE, node, n),
            gpu_model=model or None,
        )
        entries.append((start, 0, block, start, end))
    entries.sort(key=lambda e: (e[0], e[1]))
    sim_jobs: list[SimJob] = []
    recorded: list[SimJob] = []
    for i, (_submit, _kind, job, started_s, ended_s) in enumerate(entries):
        job.index = i
        sim_jobs.append(job)
        recorded.append(replace(job, start=started_s, end=ended_s))
    users = sorted({j.user for j in sim_jobs})
    user_rows = list(User.objects.filter(username__in=users).select_related("category"))
    tree = share_tree(user_rows, list(Category.objects.all()))
    workload = Workload(sim_jobs, users, {u: 1 / len(users) for u in users}, tree)
    return workload, recorded


def _lab_gpu_rows() -> list[Gpu]:
    return list(
        Gpu.objects.select_related("node", "parent")
        .exclude(state=Gpu.State.MISSING)
        .order_by("node__name", "index", "id")
    )


def debug_gpu_plan(rows: list[Gpu], count: int) -> dict[int, int]:
    """The shared slots to set per GPU (id → slots, 0: whole again) so that `count` whole GPUs
    are split into shared slots: the last ones stop sharing first, and new ones are taken
    from the last nodes. The replay and the one-click apply use the same plan."""
    partitioned = {g.parent_id for g in rows if g.parent_id and g.kind != Gpu.Kind.SLOT}
    whole = [g for g in rows if g.kind == Gpu.Kind.WHOLE]
    sharing = [g for g in whole if g.shared_slots]
    slots = Counter(g.shared_slots for g in sharing).most_common(1)
    per_gpu = slots[0][0] if slots else DEFAULT_DEBUG_SLOTS
    if count <= len(sharing):
        return {g.pk: 0 for g in sharing[count:]}
    free = [
        g
        for g in reversed(whole)
        if not g.shared_slots and g.pk not in partitioned and g.state == Gpu.State.AVAILABLE
    ]
    wanted = count - len(sharing)
    if wanted > len(free):
        raise BadReplay(
            _("Only %(count)s more whole GPUs can be split into shared slots.")
            % {"count": len(free)}
        )
    return {g.pk: per_gpu for g in free[:wanted]}


def _with_debug_gpus(rows: list[Gpu], units: list[sm.Gpu], count: int) -> list[sm.Gpu]:
    plan = debug_gpu_plan(rows, count)
    by_pk = {g.pk: g for g in rows}
    changed = {by_pk[pk].uuid: slots for pk, slots in plan.items()}
    kept = [u for u in units if u.id not in changed and (u.parent or "") not in changed]
    for pk, slots in plan.items():
        gpu = by_pk[pk]
        if slots == 0:
            kept.append(sm.Gpu(gpu.uuid, gpu.node.name, gpu.model, gpu.memory_mb))
        for s in range(slots):
            kept.append(
                sm.Gpu(
                    f"{gpu.uuid}-whatif-slot{s}",
                    gpu.node.name,
                    gpu.model,
                    gpu.memory_mb // slots,
                    sm.GpuKind.SLOT,
                    gpu.uuid,
                )
            )
    return kept


def lab_cluster(
    *, gpu_delta: int = 0, gpu_model: str = "", debug_gpus: int | None = None
) -> tuple[tuple[sm.Node, ...], tuple[sm.Gpu, ...]]:
    """The lab's schedulable GPUs; `gpu_delta` GPUs of `gpu_model` added on new nodes
    of PER_ADDED_NODE, or (negative) taken away, last nodes first; `debug_gpus` whole
    GPUs split into shared slots (None: as today)."""
    rows = _lab_gpu_rows()
    units = engine_units(rows, rows)
    if debug_gpus is not None:
        units = _with_debug_gpus(rows, units, debug_gpus)
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
    """The admin's policy as the engine sees it, with `changes` applied (priority weights,
    the attained-service thresholds, the drain reserve and queue limits; the debug GPUs
    change the cluster, not the policy)."""
    settings_row = SchedulingPolicy.current()
    policy = engine_policy(settings_row, list(Queue.objects.all()), list(Category.objects.all()))
    weights: dict[str, Any] = {}
    queues = dict(policy.queues)
    for name, value in (changes or {}).items():
        policy_knob_check(name, value)
        if name in WEIGHT_FIELDS:
            weights[name] = float(value)
        elif name == ATTAINED_FIRST:
            weights["attained_thresholds"] = attained_thresholds_scaled(
                settings_row.attained_thresholds_gpus(), float(value)
            )
        elif name == DRAIN_RESERVE:
            weights[name] = int(value)
        elif name.startswith("queue:"):
            _kind, queue, limit = name.split(":", 2)
            number = int(value)
            engine_value: float | None = number
            if limit in NULLABLE_QUEUE_LIMITS and number == 0:
                engine_value = None
            field_name = "max_wall_s" if limit == "max_time_limit_s" else limit
            queues[queue] = replace(
                queues[queue], **cast(dict[str, Any], {field_name: engine_value})
            )
    return replace(policy, queues=queues, **weights)


def with_replay_queues(policy: sm.Policy) -> sm.Policy:
    """The policy with the queues this layer puts emergencies and bookings in, ranked as the
    engine ranks an emergency (0) and a reservation job in its window (1), without limits."""
    queues = dict(policy.queues)
    queues[EMERGENCY_QUEUE] = sm.QueuePolicy(EMERGENCY_QUEUE, tier=-2, priority_factor=1.0)
    queues[BOOKING_QUEUE] = sm.QueuePolicy(BOOKING_QUEUE, tier=-1, priority_factor=1.0)
    return replace(policy, queues=queues)


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
        block = j.queue == BOOKING_QUEUE
        if not block:
            waits.append((j.start - j.submit) / 3600)
        busy_h += units * max(0.0, min(j.end, t1) - max(j.start, t0)) / 3600
        # A booking's block held its GPUs but never waited for them.
        rows.append((units, j.gpus, j.shared_slot, j.start if block else j.submit, j.start, j.end))
    weeks = {monday: WeekLine(monday) for monday, _a, _b in weeks_of(period.start, period.end)}
    unmet_demand(
        np.array(rows, dtype=float).reshape(-1, 6), capacity, period.start, period.end, weeks
    )
    return ReplayOutcome(
        label=label,
        gpus=capacity,
        jobs=sum(1 for j in jobs if j.queue != BOOKING_QUEUE),
        wait_mean_h=statistics.fmean(waits) if waits else None,
        wait_p95_h=percentile(waits, 95) if waits else None,
        allocation_pct=100 * busy_h / (capacity * period.hours)
        if capacity and period.hours
        else None,
        unmet_gpu_hours=sum(w.unmet_gpu_hours for w in weeks.values()),
        jain=jain,
        unfinished=sum(1 for j in jobs if j.start is None or j.end is None),
    )


# Options of one replay run side by side in worker processes when the period is big
# enough to pay for them (a quarter is ~40 s of simulator CPU per option; forking and
# sending the workload costs well under a second). LABPORTAL_REPLAY_PROCESSES=1 turns it off.
PARALLEL_MIN_JOBS = 2000


def _replay_processes(options: int, jobs: int) -> int:
    if options < 2 or jobs < PARALLEL_MIN_JOBS:
        return 1
    configured = os.environ.get("LABPORTAL_REPLAY_PROCESSES", "").strip()
    limit = int(configured) if configured.isdigit() and int(configured) > 0 else os.cpu_count() or 1
    return max(1, min(options, limit))


def _simulate(
    workload: Workload,
    cluster: tuple[tuple[sm.Node, ...], tuple[sm.Gpu, ...]],
    policy: sm.Policy,
) -> tuple[list[SimJob], dict[str, Any], int, float]:
    """One option's replay: pure computation, no database (it may run in a child process)."""
    sim = Simulation(
        workload,
        "labportal",
        gpus=_whole_units(cluster[1]),
        per_node=PER_ADDED_NODE,
        slot_gpus=0,
        slots_per_gpu=4,
        timeslot_s=4 * 3600.0,
        cluster=cluster,
        policy=policy,
    )
    clock = time.perf_counter()
    metrics = sim.run()
    return sim.jobs, metrics, sim.slots_per_gpu, time.perf_counter() - clock


def replay_options(
    *,
    period: Period,
    options: list[ReplayOption],
    progress: Callable[[int, int], None] | None = None,
    timings: dict[str, float] | None = None,
) -> list[ReplayOutcome]:
    """Replay the period's jobs under each option; `progress(done, total)` after each.
    `timings` (if given) receives the seconds spent exporting the history and simulating
    (`simulate_s`: the wall time of all options; `simulate_cpu_s`: their sum)."""
    clock = time.perf_counter()
    workload, recorded = workload_from_history(period)
    spent: dict[str, float] = defaultdict(float)
    spent["export_s"] = time.perf_counter() - clock
    outcomes = [
        _measure(
            _("Recorded history"),
            recorded,
            capacity=_whole_units(lab_cluster()[1]),
            period=period,
        )
    ]
    # What each option replays, read from the database here (never in a child process).
    plans = []
    for option in options:
        debug = option.policy_changes.get(DEBUG_GPUS)
        cluster = lab_cluster(
            gpu_delta=option.gpu_delta,
            gpu_model=option.gpu_model,
            debug_gpus=None if debug is None else int(debug),
        )
        policy = with_replay_queues(
            lab_policy({k: v for k, v in option.policy_changes.items() if k != DEBUG_GPUS})
        )
        plans.append((cluster, policy))
    results: list[tuple[list[SimJob], dict[str, Any], int, float] | None] = [None] * len(plans)
    processes = _replay_processes(len(plans), len(workload.jobs))
    clock = time.perf_counter()
    if processes > 1:
        # fork: the children start at once with the workload already in memory, and only
        # compute (they never touch the database connection they inherit).
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=processes, mp_context=context) as pool:
            futures = {
                pool.submit(_simulate, workload, cluster, policy): index
                for index, (cluster, policy) in enumerate(plans)
            }
            for done, future in enumerate(as_completed(futures)):
                results[futures[future]] = future.result()
                if progress is not None:
                    progress(done + 1, len(plans))
    else:
        for index, (cluster, policy) in enumerate(plans):
            results[index] = _simulate(workload, cluster, policy)
            if progress is not None:
                progress(index + 1, len(plans))
    spent["simulate_s"] = time.perf_counter() - clock
    spent["processes"] = processes
    for option, (cluster, _policy), result in zip(options, plans, results, strict=True):
        assert result is not None
        jobs, metrics, slots_per_gpu, seconds = result
        spent["simulate_cpu_s"] += seconds
        outcomes.append(
            _measure(
                option.label,
                jobs,
                capacity=_whole_units(cluster[1]),
                period=period,
                jain=metrics.get("jain"),
                slots_per_gpu=slots_per_gpu,
            )
        )
    if timings is not None:
        timings.update(spent)
    return outcomes

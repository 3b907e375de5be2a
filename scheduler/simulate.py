"""Trace simulator: replays a GPU workload trace through the engine and baselines.

``python -m scheduler.simulate --trace ../shared/traces/alibaba2023_openb_gpu.csv \\
    --gpus 32 --gpus-per-node 8 --policy labportal --users 30 --seed 1 --load 1.0 --json``

How the trace becomes jobs (see docs/scheduler.md for the reasoning):

* Pods that never started (no duration) are dropped; ``--window dense`` (default)
  keeps the last 34.5 days (submit >= 9.9e6 s), where the arrivals are.
* Users: a seeded Zipf draw (s = 1.1) over ``--users`` users; user rank r is in
  category ``staff`` (r % 5 == 0), ``phd`` (r % 5 in 1..2) or ``master``.
* Time limits: users overestimate. Each job's run time is multiplied by a seeded
  factor 1.2 + Exp(mean 1.3) and rounded up to the next standard limit
  (10 min, 30 min, 1 h, 2 h, 4 h, 8 h, 12 h, 24 h, 48 h, 72 h, 7 d; beyond, whole days).
* Queues: a 1-GPU pod asking for a GPU fraction below 1 whose limit is at most 1 h
  goes to ``debug`` on one shared slot; everything else goes to ``normal``. BE
  (best-effort) pods are marked preemptible.
* ``--load`` divides the inter-arrival times: 2.0 offers twice the work per hour.
* Runtime features: the image stands for the pod's QoS class and GPU fraction (the
  pod spec), the command for the GPU count; the trace has nothing finer.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import heapq
import json
import math
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from scheduler.engine import plan
from scheduler.model import (
    ClusterState,
    Gpu,
    GpuKind,
    Node,
    NodeState,
    PendingJob,
    Plan,
    Policy,
    QueuePolicy,
    Reason,
    RunningJob,
    ShareNode,
)
from scheduler.predict import JobFeatures, RuntimePredictor
from scheduler.priority import RankedJob, Ranker, short_level

DENSE_START_S = 9_900_000.0
STANDARD_LIMITS_S = (
    600.0,
    1800.0,
    3600.0,
    2 * 3600.0,
    4 * 3600.0,
    8 * 3600.0,
    12 * 3600.0,
    24 * 3600.0,
    48 * 3600.0,
    72 * 3600.0,
    7 * 86_400.0,
)
POLICIES = ("labportal", "fifo", "timeslots", "sjf-oracle")
CATEGORY_WEIGHTS = {"staff": 1.0, "phd": 1.0, "master": 0.5}
FAIRNESS_WINDOW_S = 86_400.0


@dataclass(slots=True)
class SimJob:
    """One trace job and what happened to it in the simulation."""

    index: int
    user: str
    category: str
    queue: str
    gpus: int
    shared_slot: bool
    submit: float
    duration: float
    time_limit: float
    preemptible: bool
    features: JobFeatures
    predicted: float = 0.0
    eta: float | None = None
    gpu_model: str | None = None
    start: float | None = None
    end: float | None = None
    gpu_ids: tuple[str, ...] = ()


@dataclass(slots=True)
class Workload:
    jobs: list[SimJob]
    users: list[str]
    entitlement: dict[str, float]
    share_tree: ShareNode
    categories: dict[str, str] = field(default_factory=dict)
    # "trace" when the trace names its users, "synthesised" when the simulator drew them.
    users_source: str = "synthesised"
    # Jobs wider than any node: refused at load, as the portal refuses them at submit.
    refused: int = 0
    window: str = "all"


class EmptyWorkload(ValueError):
    """The trace, or the window asked for, holds no job to replay."""


NO_USER = {"", "NA", "na", "None", "-"}


def auto_window_start(submits: Sequence[float]) -> float:
    """Where the dense part of a trace begins: past a sparse head (at most 1% of the jobs
    spread over more than half of the trace's span), or at its first job."""
    if len(submits) < 2:
        return submits[0] if submits else 0.0
    ordered = sorted(submits)
    span = ordered[-1] - ordered[0]
    # The head ends at the widest gap among the cuts that leave at most 1% behind.
    cuts = [k for k in range(1, len(ordered) // 100 + 1) if ordered[k] - ordered[0] > 0.5 * span]
    if not cuts:
        return ordered[0]
    k = max(cuts, key=lambda k: (ordered[k] - ordered[k - 1], k))
    return ordered[k]


def round_up_to_standard_limit(seconds: float) -> float:
    """The smallest standard limit that is at least ``seconds`` (whole days past 7 d)."""
    i = bisect.bisect_left(STANDARD_LIMITS_S, seconds)
    if i < len(STANDARD_LIMITS_S):
        return STANDARD_LIMITS_S[i]
    return math.ceil(seconds / 86_400.0) * 86_400.0


def category_of_rank(rank: int) -> str:
    if rank % 5 == 0:
        return "staff"
    if rank % 5 in (1, 2):
        return "phd"
    return "master"


def load_workload(
    path: str,
    *,
    users: int,
    seed: int,
    load: float,
    window: str,
    max_jobs: int | None,
    max_gpus_per_job: int | None = None,
) -> Workload:
    """Read the trace and turn its rows into jobs with users, limits and queues.

    Raises ``EmptyWorkload`` when nothing is left to replay. Jobs wider than
    ``max_gpus_per_job`` (the widest node) are refused and counted.
    """
    rows: list[dict[str, str]] = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            if not row["duration_s"] or not row["start_time_s"]:
                continue  # never scheduled in production: no run time to replay
            rows.append(row)
    if not rows:
        raise EmptyWorkload(f"{path} holds no job with a run time to replay")
    lo, hi = -math.inf, math.inf
    if window == "auto":
        lo = auto_window_start([float(r["submit_time_s"]) for r in rows])
    elif window == "dense":
        lo = DENSE_START_S
    elif window != "all":
        first, _, last = window.partition(":")
        try:
            lo = float(first) if first else -math.inf
            hi = float(last) if last else math.inf
        except ValueError:
            raise EmptyWorkload(
                f"--window {window!r} is not auto, dense, all or START:END in trace seconds"
            ) from None
    kept = [r for r in rows if lo <= float(r["submit_time_s"]) < hi]
    if not kept:
        submits = [float(r["submit_time_s"]) for r in rows]
        raise EmptyWorkload(
            f"--window {window} keeps none of the {len(rows)} jobs, which were submitted "
            f"between {min(submits):.0f} s and {max(submits):.0f} s; choose a window in "
            "that range, or --window all"
        )
    rows = kept
    rows.sort(key=lambda r: (float(r["submit_time_s"]), r["job_id"]))
    refused = 0
    if max_gpus_per_job is not None:
        fits = [r for r in rows if int(r["num_gpus"]) <= max_gpus_per_job]
        refused = len(rows) - len(fits)
        rows = fits
    if max_jobs is not None:
        rows = rows[:max_jobs]
    if not rows:
        raise EmptyWorkload(f"every job in the window is wider than {max_gpus_per_job} GPUs")

    rng = random.Random(seed)
    trace_users = [r["user"] for r in rows if r.get("user", "").strip() not in NO_USER]
    if len(trace_users) == len(rows):
        # The trace's own users, ranked by how many jobs they submitted (ties by name).
        counts: dict[str, int] = {}
        for name in trace_users:
            counts[name] = counts.get(name, 0) + 1
        names = sorted(counts, key=lambda n: (-counts[n], n))
        users_source = "trace"
    else:
        names = [f"user{r:02d}" for r in range(users)]
        users_source = "synthesised"
    weights = [1.0 / (r + 1) ** 1.1 for r in range(len(names))]
    categories = {name: category_of_rank(r) for r, name in enumerate(names)}
    t0 = float(rows[0]["submit_time_s"])
    jobs: list[SimJob] = []
    for i, row in enumerate(rows):
        user = row["user"] if users_source == "trace" else rng.choices(names, weights)[0]
        duration = max(1.0, float(row["duration_s"]))
        factor = 1.2 + rng.expovariate(1 / 1.3)
        limit = round_up_to_standard_limit(duration * factor)
        gpus = int(row["num_gpus"])
        frac = float(row["gpu_frac"])
        debug = gpus == 1 and frac < 1.0 and limit <= 3600.0
        submit = t0 + (float(row["submit_time_s"]) - t0) / load
        jobs.append(
            SimJob(
                index=i,
                user=user,
                category=categories[user],
                queue="debug" if debug else "normal",
                gpus=gpus,
                shared_slot=debug,
                submit=submit,
                duration=duration,
                time_limit=limit,
                preemptible=row["queue"] == "BE",
                features=JobFeatures(user, f"{row['queue']}-{frac:.2f}", "run", gpus),
            )
        )

    by_category: dict[str, list[str]] = {}
    for name in names:
        by_category.setdefault(categories[name], []).append(name)
    tree = ShareNode(
        "lab",
        1.0,
        tuple(
            ShareNode(
                cat, CATEGORY_WEIGHTS[cat] * len(members), tuple(ShareNode(u, 1.0) for u in members)
            )
            for cat, members in sorted(by_category.items())
        ),
    )
    total_weight = sum(CATEGORY_WEIGHTS[categories[n]] for n in names)
    entitlement = {n: CATEGORY_WEIGHTS[categories[n]] / total_weight for n in names}
    return Workload(
        jobs,
        names,
        entitlement,
        tree,
        categories,
        users_source=users_source,
        refused=refused,
        window=window if window != "auto" else f"auto (from {lo:.0f} s)",
    )


def build_cluster(
    gpus: int, per_node: int, slot_gpus: int, slots_per_gpu: int
) -> tuple[tuple[Node, ...], tuple[Gpu, ...]]:
    """Nodes of ``per_node`` GPUs; the last ``slot_gpus`` GPUs of the first node are
    exposed as ``slots_per_gpu`` shared slots each."""
    nodes = tuple(Node(f"node{n:02d}") for n in range(math.ceil(gpus / per_node)))
    units: list[Gpu] = []
    for g in range(gpus):
        node = f"node{g // per_node:02d}"
        index = g % per_node
        if g // per_node == 0 and index >= per_node - slot_gpus:
            for s in range(slots_per_gpu):
                units.append(
                    Gpu(
                        f"{node}-gpu{index}-slot{s}",
                        node,
                        "A10",
                        24_000 // slots_per_gpu,
                        GpuKind.SLOT,
                        f"{node}-gpu{index}",
                    )
                )
        else:
            units.append(Gpu(f"{node}-gpu{index}", node, "A10", 24_000))
    return nodes, tuple(units)


def labportal_policy() -> Policy:
    """The policy the simulator runs for LabPortal (the portal's defaults)."""
    return Policy(
        queues={
            "debug": QueuePolicy(
                "debug", tier=0, priority_factor=1.0, max_wall_s=3600.0, max_running_jobs_per_user=2
            ),
            "normal": QueuePolicy("normal", tier=1, priority_factor=0.5),
        },
        weight_fairshare=10_000.0,
        weight_age=2000.0,
        max_age_s=2 * 86_400.0,
        weight_size=100.0,
        half_life_s=7 * 86_400.0,
    )


@dataclass(slots=True)
class _Usage:
    """Decayed usage per user, kept as value at a reference time (cheap to update)."""

    half_life: float
    value: dict[str, float] = field(default_factory=dict)
    ref: float = 0.0

    def advance(self, now: float) -> None:
        if now > self.ref and self.value:
            f = 0.5 ** ((now - self.ref) / self.half_life)
            for user in self.value:
                self.value[user] *= f
        self.ref = max(self.ref, now)

    def charge(self, user: str, gpu_seconds: float) -> None:
        self.value[user] = self.value.get(user, 0.0) + gpu_seconds


# The first pass of an event looks at this many jobs, doubling while more could start.
PREFIX_MIN = 16
# Reasons that stop a strict (no backfill) pass for every job behind.
STRICT_BLOCKING = frozenset({Reason.RESOURCES, Reason.PRIORITY, Reason.RESERVATION})
# Reasons a pass gives a job whose placement failed (not a limit, not a hold).
PLACEMENT_FAILED = frozenset({Reason.RESOURCES, Reason.PRIORITY, Reason.RESERVATION})
# Reasons a pass gives a job refused by a running limit or a per-job limit.
LIMIT_FAILED = frozenset({Reason.USER_LIMIT, Reason.QUEUE_LIMIT, Reason.CATEGORY_LIMIT})
# Reasons a pass gives a job that no node (or no node up) could ever hold: they depend
# on the shape alone (jobs with a memory need are kept apart), whatever the limit.
NEVER_FITS = frozenset({Reason.CONSTRAINTS, Reason.NODE_UNAVAILABLE})
Shape = tuple[bool, int, str | None]
Owner = tuple[str, str, str]
# Owner, shape, time limit, and whether the job is special (emergency, reservation, held,
# a memory need): jobs of one class that is not special succeed or fail alike in a pass.
ClassKey = tuple[Owner, Shape, float, bool]


def _class(job: PendingJob) -> ClassKey:
    special = job.emergency or job.reservation_id is not None or job.held or job.min_memory_mb > 0
    return (_owner(job), _shape(job), job.time_limit_s, special)


def _owner(job: PendingJob) -> Owner:
    """What the engine's limits are keyed by: user, queue and category."""
    return (job.user, job.queue, job.category)


def _shape(job: PendingJob) -> Shape:
    """What a job needs of one node: a shared slot, or k GPUs (of a model, if named).
    Jobs of a reservation are their own shape (its GPUs are not the others')."""
    model = job.gpu_model if job.reservation_id is None else f"{job.gpu_model}@{job.reservation_id}"
    return (True, 1, model) if job.shared_slot else (False, max(1, job.gpus), model)


class _Backlog:
    """Pending jobs, kept so that the first M in scheduling order come without a full sort.

    Multifactor order: jobs that share user, queue, category and width share every
    priority term but age, and age only grows with waiting, so inside such a group
    the order is submit order; the global order is a merge of the groups' heads,
    keyed by the engine's own ``Ranker``. FIFO and shortest-first keys never change,
    so those jobs sit in one list sorted once, on arrival.
    """

    def __init__(self, policy: Policy) -> None:
        self.static = policy.order in ("fifo", "shortest_first")
        # Grouping needs priority to fall with submit time inside a group.
        self.by_group = not self.static and policy.weight_age >= 0
        self.jobs: dict[int, PendingJob] = {}
        self.groups: dict[tuple[str, str, str, int, bool, int], list[int]] = {}
        self.ordered: list[tuple[tuple[float, ...], int]] = []
        self.keys: dict[int, tuple[float, ...]] = {}
        self.shapes: Counter[Shape] = Counter()
        # Pending count per (shape, time limit): the shortest limit of a shape bounds
        # what could still squeeze in before a guarantee.
        self.limits: Counter[tuple[Owner, Shape, float]] = Counter()
        # The same jobs by class (owner, shape, limit, special), each list in the
        # engine's order: what lets a pass pick the jobs behind the head that could start.
        self.classes: dict[ClassKey, list[tuple[tuple[float, ...], int]]] = {}
        # The classes by shape and limit (the special ones apart), so that a pass finds
        # those that could start without visiting the others.
        self.by_shape: dict[Shape, dict[float, dict[ClassKey, None]]] = {}
        self.special: set[ClassKey] = set()
        self.policy = policy

    def __len__(self) -> int:
        return len(self.jobs)

    def _group(self, job: PendingJob) -> tuple[str, str, str, int, bool, int]:
        # The short-job level is the one per-job priority term besides age.
        return (
            job.user,
            job.queue,
            job.category,
            job.gpus,
            job.shared_slot,
            short_level(job, self.policy),
        )

    def _within(self, job: PendingJob) -> tuple[float, ...]:
        """The order inside a class: submit order, or the fixed key of FIFO and
        shortest-first (a class shares user, queue, category, width and limit)."""
        if self.static:
            return Ranker.static_key(job, self.policy)
        return (job.submit_time, job.id)

    def add(self, job: PendingJob) -> None:
        self.jobs[job.id] = job
        self.shapes[_shape(job)] += 1
        self.limits[(_owner(job), _shape(job), job.time_limit_s)] += 1
        key = _class(job)
        members = self.classes.get(key)
        if members is None:
            members = self.classes[key] = []
            if key[3]:
                self.special.add(key)
            else:
                self.by_shape.setdefault(key[1], {}).setdefault(key[2], {})[key] = None
        item = (self._within(job), job.id)
        if not members or members[-1] < item:
            members.append(item)
        else:
            bisect.insort(members, item)
        if self.by_group:
            # Arrivals come in (submit, id) order, so appending keeps each group sorted.
            self.groups.setdefault(self._group(job), []).append(job.id)
        elif self.static:
            order = Ranker.static_key(job, self.policy)
            self.keys[job.id] = order
            bisect.insort(self.ordered, (order, job.id))

    def remove(self, job_id: int) -> None:
        job = self.jobs.pop(job_id)
        self.shapes[_shape(job)] -= 1
        self.limits[(_owner(job), _shape(job), job.time_limit_s)] -= 1
        key = _class(job)
        members = self.classes[key]
        del members[bisect.bisect_left(members, (self._within(job), job.id))]
        if not members:
            del self.classes[key]
            if key[3]:
                self.special.discard(key)
            else:
                by_limit = self.by_shape[key[1]]
                same = by_limit[key[2]]
                del same[key]
                if not same:
                    del by_limit[key[2]]
                    if not by_limit:
                        del self.by_shape[key[1]]
        if self.by_group:
            group = self.groups[self._group(job)]
            group.remove(job_id)
            if not group:
                del self.groups[self._group(job)]
        elif self.static:
            item = (self.keys.pop(job_id), job_id)
            del self.ordered[bisect.bisect_left(self.ordered, item)]

    def prefix(self, ranker: Ranker, size: int, must: Iterable[int]) -> list[PendingJob]:
        """The first ``size`` jobs in scheduling order, extended to hold every job in
        ``must`` that is still pending."""
        missing = {i for i in must if i in self.jobs}
        out: list[PendingJob] = []
        if not self.by_group and not self.static:
            # No shortcut for this policy: rank everything, as the engine does.
            ranked = sorted((ranker.rank(job) for job in self.jobs.values()), key=_sort_key)
            ordered = [(item.sort_key, item.job.id) for item in ranked]
        else:
            ordered = self.ordered
        if not self.by_group:
            for _key, job_id in ordered:
                if len(out) >= size and not missing:
                    break
                out.append(self.jobs[job_id])
                missing.discard(job_id)
            return out
        jobs = self.jobs
        heap: list[tuple[tuple[float, ...], int, int]] = []
        members = list(self.groups.values())
        for g, ids in enumerate(members):
            heap.append((ranker.rank(jobs[ids[0]]).sort_key, g, 0))
        heapq.heapify(heap)
        while heap and (len(out) < size or missing):
            _key, g, pos = heapq.heappop(heap)
            ids = members[g]
            out.append(jobs[ids[pos]])
            missing.discard(ids[pos])
            if pos + 1 < len(ids):
                heapq.heappush(heap, (ranker.rank(jobs[ids[pos + 1]]).sort_key, g, pos + 1))
        return out

    def behind(self, ranker: Ranker, live: dict[ClassKey, int], count: int) -> list[PendingJob]:
        """The next ``count`` jobs in scheduling order among the classes in ``live``,
        each class from its position there (advanced past the jobs returned). The jobs
        of these classes that come before the last one returned are all returned."""
        jobs = self.jobs
        heap: list[tuple[tuple[float, ...], int, ClassKey]] = []
        for n, (key, pos) in enumerate(live.items()):
            members = self.classes[key]
            if pos < len(members):
                heap.append((ranker.rank(jobs[members[pos][1]]).sort_key, n, key))
        heapq.heapify(heap)
        out: list[PendingJob] = []
        while heap and len(out) < count:
            _key, n, key = heapq.heappop(heap)
            members = self.classes[key]
            pos = live[key]
            out.append(jobs[members[pos][1]])
            live[key] = pos + 1
            if pos + 1 < len(members):
                heapq.heappush(heap, (ranker.rank(jobs[members[pos + 1][1]]).sort_key, n, key))
        return out


def _witnesses(
    shown: Iterable[PendingJob], result: Plan
) -> tuple[dict[Shape, float], dict[tuple[Owner, Shape], float]]:
    """What the pass's failures prove about the jobs behind them: (shortest failed limit
    per shape, shortest limit refused by a limit per owner and shape).

    Within a pass, a placement that failed fails again for the same shape with a limit
    as long or longer (free units only disappear, blocks only appear, and a longer job
    meets more blocks and the drain reserve): such jobs cannot start. A shape no node
    could ever hold fails at every limit. Likewise a limit
    (user, queue, category) that refused a job refuses the same owner's later jobs of
    that shape with limits as long: counters only grow."""
    failed: dict[Shape, float] = {}
    limited: dict[tuple[Owner, Shape], float] = {}
    for job in shown:
        info = result.pending.get(job.id)
        if info is None or job.emergency or job.min_memory_mb > 0:
            continue
        shape = _shape(job)
        if info.reason in NEVER_FITS and job.reservation_id is None:
            failed[shape] = -math.inf
        elif info.reason in PLACEMENT_FAILED:
            failed[shape] = min(failed.get(shape, math.inf), job.time_limit_s)
        elif info.reason in LIMIT_FAILED:
            key = (_owner(job), shape)
            limited[key] = min(limited.get(key, math.inf), job.time_limit_s)
    return failed, limited


def _sort_key(item: RankedJob) -> tuple[float, ...]:
    return item.sort_key


class _FreeUnits:
    """Free units per node, generously: a unit counts as free unless a running job holds
    it or a unit sharing its physical GPU; MIG counts as whole. Used only to prove that
    nothing more can start, so erring towards "free" costs time, never a decision."""

    def __init__(self, nodes: Sequence[Node], units: Sequence[Gpu]) -> None:
        up = {n.name for n in nodes if n.state == NodeState.UP}
        self.index = {g.id: i for i, g in enumerate(units)}
        self.node = [g.node for g in units]
        self.slot = [g.kind == GpuKind.SLOT for g in units]
        self.usable = [g.node in up for g in units]
        self.holds = [0] * len(units)
        self.whole_free: dict[str, int] = {}
        self.slots_free = 0
        parents = {g.id: i for i, g in enumerate(units)}
        self.conflicts: list[list[int]] = [[] for _ in units]
        for i, g in enumerate(units):
            p = parents.get(g.parent) if g.parent is not None else None
            if p is not None:
                self.conflicts[i].append(p)
                self.conflicts[p].append(i)
        for i in range(len(units)):
            self._count(i, +1)

    def _count(self, i: int, sign: int) -> None:
        if not self.usable[i]:
            return
        if self.slot[i]:
            self.slots_free += sign
        else:
            node = self.node[i]
            self.whole_free[node] = self.whole_free.get(node, 0) + sign

    def _hold(self, gpu_ids: Iterable[str], step: int) -> None:
        for gid in gpu_ids:
            u = self.index.get(gid)
            if u is None:
                continue
            for v in (u, *self.conflicts[u]):
                before = self.holds[v]
                self.holds[v] += step
                if before == 0 and step > 0:
                    self._count(v, -1)
                elif self.holds[v] == 0:
                    self._count(v, +1)

    def take(self, gpu_ids: Iterable[str]) -> None:
        self._hold(gpu_ids, +1)

    def release(self, gpu_ids: Iterable[str]) -> None:
        self._hold(gpu_ids, -1)

    def any_fits(self, shapes: Counter[Shape]) -> bool:
        """Could a job of any of these shapes (count > 0) find room on one node now?"""
        widest = max(self.whole_free.values(), default=0)
        return any(
            n > 0 and (self.slots_free > 0 if slot else k <= widest)
            for (slot, k, _model), n in shapes.items()
        )

    def any_fits_before(self, shortest: dict[Shape, float], windows: dict[int, float]) -> bool:
        """Could a job of some shape, with that shape's shortest time limit, start now
        on free units whose window (seconds until a block on them starts) is long enough?"""
        if not shortest:
            return False
        per_node: dict[str, list[float]] = {}
        slot_windows: list[float] = []
        for u, holds in enumerate(self.holds):
            if holds or not self.usable[u]:
                continue
            window = windows.get(u, math.inf)
            if self.slot[u]:
                slot_windows.append(window)
            else:
                per_node.setdefault(self.node[u], []).append(window)
        for (slot, k, _model), limit in shortest.items():
            if slot:
                if any(w >= limit for w in slot_windows):
                    return True
            elif any(sum(1 for w in ws if w >= limit) >= k for ws in per_node.values()):
                return True
        return False

    def room(self, windows: dict[int, float]) -> tuple[float, list[float]]:
        """The longest time limit that could start now: on a shared slot, and on k whole
        units of one node (index k - 1), given each unit's window (see ``windows``)."""
        per_node: dict[str, list[float]] = {}
        slot_best = -math.inf
        for u, holds in enumerate(self.holds):
            if holds or not self.usable[u]:
                continue
            window = windows.get(u, math.inf)
            if self.slot[u]:
                slot_best = max(slot_best, window)
            else:
                per_node.setdefault(self.node[u], []).append(window)
        best: list[float] = []
        for ws in per_node.values():
            ws.sort(reverse=True)
            for k, w in enumerate(ws):
                if k == len(best):
                    best.append(w)
                elif w > best[k]:
                    best[k] = w
        return slot_best, best

    def windows(
        self, blocks: Iterable[tuple[float, Iterable[str]]], now: float
    ) -> dict[int, float]:
        """Seconds from ``now`` until the first of these blocks (start, GPUs) on each unit."""
        out: dict[int, float] = {}
        for start, gpu_ids in blocks:
            for gid in gpu_ids:
                u = self.index.get(gid)
                if u is None:
                    continue
                for v in (u, *self.conflicts[u]):
                    out[v] = min(out.get(v, math.inf), start - now)
        return out


class _EtaBudget:
    """Which arrivals get a start estimate. A forecast costs the jobs it plays, up to the
    new job's place; the budget grants ``PER_ARRIVAL`` jobs of forecast per arrival
    (plus a start-up allowance), so the forecasts' total stays linear in the jobs.
    While the backlog is shallow every arrival is estimated; in a deep one, a share,
    chosen without looking at the job (so the sample is not biased to short queues)."""

    PER_ARRIVAL = 8
    START = 4000

    def __init__(self) -> None:
        self.left = float(self.START)

    def accrue(self) -> None:
        self.left += self.PER_ARRIVAL

    def allows(self) -> bool:
        return self.left >= 0

    def spend(self, played: int) -> None:
        self.left -= played


def _unit_gpus(job: SimJob, slots_per_gpu: int) -> float:
    return 1.0 / slots_per_gpu if job.shared_slot else float(job.gpus)


class Simulation:
    """A discrete-event replay of one workload under one policy."""

    def __init__(
        self,
        workload: Workload,
        policy_name: str,
        *,
        gpus: int,
        per_node: int,
        slot_gpus: int,
        slots_per_gpu: int,
        timeslot_s: float,
        cluster: tuple[tuple[Node, ...], tuple[Gpu, ...]] | None = None,
        policy: Policy | None = None,
        incremental: bool = True,
    ) -> None:
        """``cluster`` and ``policy`` replace the built-in homogeneous cluster and the
        named policy (the portal's what-if replays pass the lab's own). ``incremental``
        False replays with a full engine pass over the whole backlog at every event (the
        old, quadratic path, kept as the baseline the speed bench compares with)."""
        self.workload = workload
        self.policy_name = policy_name
        self.gpus = gpus
        self.slots_per_gpu = slots_per_gpu
        self.timeslot_s = timeslot_s
        self.nodes, self.units = cluster or build_cluster(gpus, per_node, slot_gpus, slots_per_gpu)
        self.jobs = [replace(j) for j in workload.jobs]
        oracle = policy_name == "sjf-oracle"
        if oracle:
            for job in self.jobs:
                job.time_limit = job.duration  # the oracle knows the true run time
        if policy_name == "labportal":
            self.policy = labportal_policy()
        elif policy_name == "fifo":
            self.policy = Policy(order="fifo", backfill=False, queues=labportal_policy().queues)
        elif policy_name == "sjf-oracle":
            self.policy = Policy(order="shortest_first", queues=labportal_policy().queues)
        else:
            self.policy = Policy(order="fifo", backfill=False)
        if policy_name != "labportal":
            # Baselines have no per-user limits and no drain reserve; only LabPortal
            # enforces them.
            self.policy = replace(
                self.policy,
                queues={
                    "debug": QueuePolicy("debug", tier=0),
                    "normal": QueuePolicy("normal", tier=1),
                },
                drain_horizon_s=None,
            )
        if policy is not None:
            self.policy = policy
        self.oracle = oracle
        self.predictor = RuntimePredictor()
        self.runtime_errors: list[float] = []
        self.busy_integral = 0.0
        self.waiting_time = 0.0
        self.incremental = incremental
        # Jobs whose start estimate the deep-backlog sampling skipped (see _EtaBudget).
        self.eta_skipped: set[int] = set()
        self.passes = 0
        # Jobs a pass picked from behind the head (classes that could still start).
        self.picked = 0
        # Called as (jobs arrived so far, pending now) after each arrival (the speed bench).
        self.on_arrival: Callable[[int, int], None] | None = None

    # ------------------------------------------------------------------ loop
    def run(self) -> dict[str, Any]:
        began = time.perf_counter()
        if self.policy_name == "timeslots":
            self._run_timeslots()
        elif self.incremental:
            self._run_engine_incremental()
        else:
            self._run_engine()
        metrics = self._metrics()
        metrics["sim_seconds"] = round(time.perf_counter() - began, 3)
        return metrics

    def _account(self, t_prev: float, t: float, busy: float, waiting: bool) -> None:
        if waiting and t > t_prev:
            self.busy_integral += busy * (t - t_prev)
            self.waiting_time += t - t_prev

    def _arrive(self, job: SimJob) -> None:
        if self.oracle:
            job.predicted = job.duration
        else:
            job.predicted = self.predictor.predict(job.features, job.time_limit)
        self.runtime_errors.append(abs(job.predicted - job.duration) / job.duration)

    def _finish(self, job: SimJob) -> None:
        self.predictor.observe(job.features, job.duration, job.time_limit)

    def _run_engine(self) -> None:
        jobs = self.jobs
        usage = _Usage(self.policy.half_life_s)
        pending: dict[int, PendingJob] = {}
        running: dict[int, RunningJob] = {}
        finishes: list[tuple[float, int]] = []
        next_arrival = 0
        busy = 0.0
        t_prev = jobs[0].submit if jobs else 0.0
        while next_arrival < len(jobs) or finishes:
            t = min(
                jobs[next_arrival].submit if next_arrival < len(jobs) else math.inf,
                finishes[0][0] if finishes else math.inf,
            )
            self._account(t_prev, t, busy, bool(pending))
            t_prev = t
            while finishes and finishes[0][0] <= t:
                _, idx = heapq.heappop(finishes)
                job = jobs[idx]
                del running[idx]
                busy -= _unit_gpus(job, self.slots_per_gpu)
                usage.advance(t)
                usage.charge(job.user, job.duration * _unit_gpus(job, self.slots_per_gpu))
                self._finish(job)
            arrived = False
            while next_arrival < len(jobs) and jobs[next_arrival].submit <= t:
                job = jobs[next_arrival]
                self._arrive(job)
                pending[job.index] = self._pending_job(job)
                next_arrival += 1
                arrived = True
                if self.on_arrival is not None:
                    self.on_arrival(next_arrival, len(pending))
            if not pending:
                continue
            usage.advance(t)
            current = _usage_with_running(usage.value, running.values(), t)
            state = ClusterState(
                nodes=self.nodes,
                gpus=self.units,
                pending=tuple(pending.values()),
                running=tuple(running.values()),
                share_tree=self.workload.share_tree,
                usage=current,
            )
            result = plan(state, self.policy, t, estimates=arrived)
            for start in result.starts:
                job = jobs[start.job_id]
                job.start = t
                job.end = t + job.duration
                job.gpu_ids = start.gpu_ids
                del pending[job.index]
                running[job.index] = self._running_job(job, start.gpu_ids, t)
                busy += _unit_gpus(job, self.slots_per_gpu)
                heapq.heappush(finishes, (job.end, job.index))
            if arrived:
                for job_id, info in result.pending.items():
                    job = jobs[job_id]
                    if job.eta is None:
                        job.eta = info.estimated_start

    @staticmethod
    def _running_job(job: SimJob, gpu_ids: tuple[str, ...], t: float) -> RunningJob:
        return RunningJob(
            id=job.index,
            user=job.user,
            queue=job.queue,
            gpu_ids=gpu_ids,
            start_time=t,
            time_limit_s=job.time_limit,
            predicted_runtime_s=job.predicted,
            preemptible=job.preemptible,
            category=job.category,
        )

    @staticmethod
    def _pending_job(job: SimJob) -> PendingJob:
        return PendingJob(
            id=job.index,
            user=job.user,
            queue=job.queue,
            submit_time=job.submit,
            gpus=job.gpus,
            shared_slot=job.shared_slot,
            time_limit_s=job.time_limit,
            predicted_runtime_s=job.predicted,
            preemptible=job.preemptible,
            category=job.category,
            gpu_model=job.gpu_model,
        )

    def _run_engine_incremental(self) -> None:
        """The same replay as ``_run_engine``, without its cost growing with the backlog.

        * Only a prefix of the backlog, in scheduling order, goes to the engine: a pass
          decides jobs strictly in order, so the first M jobs get the decisions they would
          get in a pass over all of them. The prefix grows (doubling) until no job behind
          it could start: none of their shapes fits the GPUs still free (judged
          generously), or strict FIFO is blocked.
        * The prefix comes from ``_Backlog``, which keeps jobs grouped so that the order
          needs no full sort (see there).
        * A pass that could start nothing (no pending shape fits a free GPU) and owes no
          estimate is skipped: the engine would return no start.
        * Start estimates need the forecast up to the new job's place; in a deep backlog
          that is most of it, so ``_EtaBudget`` samples which arrivals get one.
        Decisions equal the full path's; estimates too while every arrival is sampled.
        """
        jobs = self.jobs
        usage = _Usage(self.policy.half_life_s)
        backlog = _Backlog(self.policy)
        free = _FreeUnits(self.nodes, self.units)
        budget = _EtaBudget()
        owed: set[int] = set()  # sampled jobs still without an estimate
        running: dict[int, RunningJob] = {}
        finishes: list[tuple[float, int]] = []
        next_arrival = 0
        busy = 0.0
        t_prev = jobs[0].submit if jobs else 0.0
        largest = max(Counter(g.node for g in self.units).values(), default=0)
        while next_arrival < len(jobs) or finishes:
            t = min(
                jobs[next_arrival].submit if next_arrival < len(jobs) else math.inf,
                finishes[0][0] if finishes else math.inf,
            )
            self._account(t_prev, t, busy, len(backlog) > 0)
            t_prev = t
            while finishes and finishes[0][0] <= t:
                _, idx = heapq.heappop(finishes)
                job = jobs[idx]
                free.release(running.pop(idx).gpu_ids)
                busy -= _unit_gpus(job, self.slots_per_gpu)
                usage.advance(t)
                usage.charge(job.user, job.duration * _unit_gpus(job, self.slots_per_gpu))
                self._finish(job)
            arrivals: list[int] = []
            while next_arrival < len(jobs) and jobs[next_arrival].submit <= t:
                job = jobs[next_arrival]
                self._arrive(job)
                backlog.add(self._pending_job(job))
                arrivals.append(job.index)
                next_arrival += 1
                budget.accrue()
                if self.on_arrival is not None:
                    self.on_arrival(next_arrival, len(backlog))
            if not backlog:
                continue
            usage.advance(t)
            want_eta = bool(arrivals) and budget.allows()
            if want_eta:
                owed.update(arrivals)
            if not want_eta:
                self.eta_skipped.update(arrivals)
                if not free.any_fits(backlog.shapes):
                    continue  # no pending job fits any free GPU: the pass would start none
            current = _usage_with_running(usage.value, running.values(), t)
            base = ClusterState(
                nodes=self.nodes,
                gpus=self.units,
                running=tuple(running.values()),
                share_tree=self.workload.share_tree,
                usage=current,
            )
            ranker = Ranker(base, self.policy, t, {}, largest)
            prefix, result = self._decide(
                backlog, ranker, base, free, t, owed if want_eta else (), want_eta
            )
            if want_eta:
                budget.spend(len(prefix))
            for start in result.starts:
                job = jobs[start.job_id]
                job.start = t
                job.end = t + job.duration
                job.gpu_ids = start.gpu_ids
                backlog.remove(job.index)
                owed.discard(job.index)
                free.take(start.gpu_ids)
                running[job.index] = self._running_job(job, start.gpu_ids, t)
                busy += _unit_gpus(job, self.slots_per_gpu)
                heapq.heappush(finishes, (job.end, job.index))
            if want_eta:
                # Only the head's estimates are exact: the jobs picked from behind it
                # were played forward without the jobs skipped between them.
                head = {job.id for job in prefix}
                for job_id, info in result.pending.items():
                    job = jobs[job_id]
                    if job.eta is None and job_id not in self.eta_skipped and job_id in head:
                        job.eta = info.estimated_start
                        if job.eta is not None:
                            owed.discard(job_id)

    def _decide(
        self,
        backlog: _Backlog,
        ranker: Ranker,
        base: ClusterState,
        free: _FreeUnits,
        now: float,
        must: Iterable[int],
        estimates: bool,
    ) -> tuple[list[PendingJob], Plan]:
        """One event's pass, over as few jobs as the decisions allow: (the head of the
        backlog shown to the engine, its plan). The plan's starts are the starts a pass
        over the whole backlog would make.

        The head is the first M jobs in order (M doubling from ``PREFIX_MIN``) until every
        backfill guarantee went to a job in it. Past that point a job that does not start
        changes nothing for the jobs behind it, so only the jobs of classes that could
        still start are added (``_live_classes``), every such job up to a point in the
        order, and the pass is run again until no class behind could start."""
        policy = self.policy
        # Picking from behind needs each class's order to be the engine's (not so for a
        # negative age weight, where the backlog sorts) and guarantees that run out.
        pick = policy.backfill and (backlog.by_group or backlog.static)
        size = PREFIX_MIN
        while True:
            prefix = backlog.prefix(ranker, size, must)
            shown = prefix
            taken: Counter[ClassKey] | None = None
            count = 0
            while True:
                result = plan(replace(base, pending=tuple(shown)), policy, now, estimates=estimates)
                self.passes += 1
                if len(shown) == len(backlog):
                    return prefix, result
                if not pick or len(result.guarantees) < policy.backfill_depth:
                    break  # a job behind could still take a guarantee: a longer head
                if taken is None:
                    taken = Counter(_class(job) for job in prefix)
                live = self._live_classes(backlog, shown, result, free, now, taken)
                if not live:
                    return prefix, result
                count = max(2 * count, len(live), 16)
                more = backlog.behind(ranker, live, count)
                taken.update({key: pos - taken[key] for key, pos in live.items()})
                shown = shown + more
                self.picked += len(more)
            if self._rest_cannot_start(backlog, prefix, result, free, now):
                return prefix, result
            size = 2 * len(prefix)

    def _live_classes(
        self,
        backlog: _Backlog,
        shown: list[PendingJob],
        result: Plan,
        free: _FreeUnits,
        now: float,
        taken: Counter[ClassKey],
    ) -> dict[ClassKey, int]:
        """Classes with jobs not yet shown that could start in this pass, each with the
        number of its jobs already shown. Every job not shown comes after every job
        shown, so what failed among the shown fails for them (see ``_rest_cannot_start``),
        and so does a shape with no free room for its limit once the shown jobs started."""
        failed, limited = _witnesses(shown, result)
        started = [start.gpu_ids for start in result.starts]
        for gpu_ids in started:
            free.take(gpu_ids)
        try:
            windows = free.windows(((g.start, g.gpu_ids) for g in result.guarantees.values()), now)
            slot_room, whole_room = free.room(windows)
        finally:
            for gpu_ids in started:
                free.release(gpu_ids)
        live: dict[ClassKey, int] = {}
        classes = backlog.classes
        for key in backlog.special:
            pos = taken.get(key, 0)
            if pos < len(classes[key]):
                live[key] = pos
        for shape, by_limit in backlog.by_shape.items():
            slot, k, _model = shape
            room = slot_room if slot else (whole_room[k - 1] if k <= len(whole_room) else 0.0)
            shortest_failed = failed.get(shape, math.inf)
            for limit in sorted(by_limit):
                if limit >= shortest_failed or limit > room:
                    break  # so are the longer limits of this shape
                for key in by_limit[limit]:
                    pos = taken.get(key, 0)
                    if pos < len(classes[key]) and limit < limited.get((key[0], shape), math.inf):
                        live[key] = pos
        return live

    def _rest_cannot_start(
        self,
        backlog: _Backlog,
        prefix: list[PendingJob],
        result: Plan,
        free: _FreeUnits,
        now: float,
    ) -> bool:
        """True when no job behind the prefix could start in this pass."""
        if not self.policy.backfill and any(
            info.reason in STRICT_BLOCKING for info in result.pending.values()
        ):
            return True  # strict order: everything behind a blocked job waits
        rest = Counter(backlog.limits)
        rest.subtract((_owner(job), _shape(job), job.time_limit_s) for job in prefix)
        failed, limited = _witnesses(prefix, result)
        shortest: dict[Shape, float] = {}
        for (owner, shape, limit), n in rest.items():
            if (
                n > 0
                and limit < shortest.get(shape, math.inf)
                and limit < failed.get(shape, math.inf)
                and limit < limited.get((owner, shape), math.inf)
            ):
                shortest[shape] = limit
        started = [start.gpu_ids for start in result.starts]
        for gpu_ids in started:
            free.take(gpu_ids)
        try:
            windows = free.windows(((g.start, g.gpu_ids) for g in result.guarantees.values()), now)
            return not free.any_fits_before(shortest, windows)
        finally:
            for gpu_ids in started:
                free.release(gpu_ids)

    def _run_timeslots(self) -> None:
        """Fixed rotation: in slot s, node n belongs to user (s + n) mod users, so every user
        holds every node in turn. Only
        the owner starts jobs there (first fit, submit order); jobs run to completion."""
        jobs = self.jobs
        users = self.workload.users
        node_units: dict[str, list[Gpu]] = {}
        for unit in self.units:
            node_units.setdefault(unit.node, []).append(unit)
        node_names = sorted(node_units)
        free: dict[str, set[str]] = {n: {u.id for u in node_units[n]} for n in node_names}
        parent_busy: dict[str, int] = {}
        pending_by_user: dict[str, list[SimJob]] = {}
        finishes: list[tuple[float, int]] = []
        next_arrival = 0
        busy = 0.0
        n_pending = 0
        t_prev = jobs[0].submit if jobs else 0.0
        while next_arrival < len(jobs) or finishes or n_pending:
            if (
                not finishes
                and next_arrival >= len(jobs)
                and t_prev > jobs[-1].submit + 20 * 365 * 86_400
            ):
                break  # what is left can never fit any node
            t_next_slot = (math.floor(t_prev / self.timeslot_s) + 1) * self.timeslot_s
            t = min(
                jobs[next_arrival].submit if next_arrival < len(jobs) else math.inf,
                finishes[0][0] if finishes else math.inf,
                t_next_slot if n_pending else math.inf,
            )
            self._account(t_prev, t, busy, n_pending > 0)
            t_prev = t
            while finishes and finishes[0][0] <= t:
                _, idx = heapq.heappop(finishes)
                job = jobs[idx]
                node = job.gpu_ids[0].split("-")[0]
                free[node].update(job.gpu_ids)
                busy -= _unit_gpus(job, self.slots_per_gpu)
                self._finish(job)
            while next_arrival < len(jobs) and jobs[next_arrival].submit <= t:
                job = jobs[next_arrival]
                self._arrive(job)
                pending_by_user.setdefault(job.user, []).append(job)
                n_pending += 1
                next_arrival += 1
            slot = math.floor(t / self.timeslot_s)
            for n, node in enumerate(node_names):
                owner = users[(slot + n) % len(users)]
                queue = pending_by_user.get(owner)
                if not queue:
                    continue
                for job in list(queue):
                    units = self._timeslot_fit(job, node_units[node], free[node], parent_busy)
                    if units is None:
                        continue
                    queue.remove(job)
                    n_pending -= 1
                    free[node].difference_update(units)
                    job.start, job.end, job.gpu_ids = t, t + job.duration, tuple(units)
                    busy += _unit_gpus(job, self.slots_per_gpu)
                    heapq.heappush(finishes, (job.end, job.index))

    @staticmethod
    def _timeslot_fit(
        job: SimJob, units: Sequence[Gpu], free: set[str], _parent_busy: dict[str, int]
    ) -> list[str] | None:
        kind = GpuKind.SLOT if job.shared_slot else GpuKind.WHOLE
        fits = [u.id for u in units if u.kind == kind and u.id in free]
        need = 1 if job.shared_slot else job.gpus
        return fits[:need] if len(fits) >= need else None

    # --------------------------------------------------------------- metrics
    def _metrics(self) -> dict[str, Any]:
        done = [j for j in self.jobs if j.start is not None and j.end is not None]
        waits = [_start(j) - j.submit for j in done]
        by_queue: dict[str, list[float]] = {}
        for j in done:
            by_queue.setdefault(j.queue, []).append(_start(j) - j.submit)
        jct = [_end(j) - j.submit for j in done]
        slowdown = [max(1.0, (_end(j) - j.submit) / max(j.duration, 10.0)) for j in done]
        # Only jobs that waited: one started in the pass that saw it arrive is exact by
        # construction and would flatter the median.
        eta_errors = [
            abs((j.eta or 0.0) - _start(j))
            for j in done
            if j.eta is not None and _start(j) > j.submit
        ]
        capacity = float(self.gpus)
        return {
            "policy": self.policy_name,
            "gpus": self.gpus,
            "jobs": len(self.jobs),
            "allocation": round(self.busy_integral / (capacity * self.waiting_time), 4)
            if self.waiting_time > 0
            else None,
            "wait_mean_s": _round(statistics.fmean(waits)) if waits else None,
            "wait_p50_s": _round(_percentile(waits, 50)),
            "wait_p95_s": _round(_percentile(waits, 95)),
            "wait_p95_s_by_queue": {
                q: _round(_percentile(w, 95)) for q, w in sorted(by_queue.items())
            },
            "jct_mean_s": _round(statistics.fmean(jct)) if jct else None,
            "bounded_slowdown_mean": _round(statistics.fmean(slowdown), 3) if slowdown else None,
            "jain": _round(self._jain(done), 4),
            "jain_contention": _round(self._jain_contention(done), 4),
            "slowdown_fairness": _round(self._slowdown_fairness(done), 4),
            "eta_error_median_s": _round(statistics.median(eta_errors))
            if eta_errors and self.policy_name != "timeslots"
            else None,
            "eta_error_median_s_by_horizon": _eta_errors_by_horizon(done)
            if self.policy_name != "timeslots"
            else None,
            "eta_lead_ratio_p25_p75": _lead_ratio_band(done),
            "eta_near_delay_p25_p75_s": _near_delay_band(done),
            # Arrivals whose estimate the deep-backlog sampling skipped (0: all estimated).
            "eta_skipped": len(self.eta_skipped),
            "runtime_error_median": _round(statistics.median(self.runtime_errors), 4)
            if self.runtime_errors
            else None,
            "unfinished": len(self.jobs) - len(done),
            "refused_too_wide": self.workload.refused,
            "users_source": self.workload.users_source,
            "window": self.workload.window,
        }

    def _daily_jain(self, done: list[SimJob]) -> list[tuple[float, float]]:
        """Per day with demand from two or more users: (Jain's index, waiting GPU-seconds).

        The index is over x_u = received / fair, where ``fair`` is the weighted max-min
        share of the day's capacity given each user's demand that day; the weight is the
        GPU-seconds that jobs spent waiting that day (a quiet day weighs nothing)."""
        if not done:
            return []
        t0 = min(j.submit for j in done)
        t1 = max(_end(j) for j in done)
        windows = max(1, math.ceil((t1 - t0) / FAIRNESS_WINDOW_S))
        demand = [dict[str, float]() for _ in range(windows)]
        received = [dict[str, float]() for _ in range(windows)]
        waiting = [dict[str, float]() for _ in range(windows)]
        for j in done:
            g = _unit_gpus(j, self.slots_per_gpu)
            _spread(demand, j.user, j.submit, _end(j), g, t0)
            _spread(received, j.user, _start(j), _end(j), g, t0)
            _spread(waiting, j.user, j.submit, _start(j), g, t0)
        capacity = self.gpus * FAIRNESS_WINDOW_S
        days: list[tuple[float, float]] = []
        for want, got, waited in zip(demand, received, waiting, strict=True):
            fair = _water_fill(want, self.workload.entitlement, capacity)
            xs = [got.get(u, 0.0) / f for u, f in fair.items() if f > 0]
            if len(xs) >= 2 and sum(x * x for x in xs) > 0:
                days.append((_jain_index(xs), sum(waited.values())))
        return days

    def _jain(self, done: list[SimJob]) -> float | None:
        """Mean over days of the daily index (every day with demand counts the same)."""
        days = self._daily_jain(done)
        return statistics.fmean(i for i, _ in days) if days else None

    def _jain_contention(self, done: list[SimJob]) -> float | None:
        """The daily index weighted by that day's waiting: fairness where it was contested."""
        days = self._daily_jain(done)
        total = sum(w for _, w in days)
        return sum(i * w for i, w in days) / total if total > 0 else None

    def _slowdown_fairness(self, done: list[SimJob]) -> float | None:
        """Jain's index over users of 1 / their mean bounded slowdown (1.0: equal slowdowns)."""
        per_user: dict[str, list[float]] = {}
        for j in done:
            per_user.setdefault(j.user, []).append(
                max(1.0, (_end(j) - j.submit) / max(j.duration, 10.0))
            )
        xs = [1.0 / statistics.fmean(v) for v in per_user.values()]
        return _jain_index(xs) if len(xs) >= 2 else None


def _usage_with_running(
    usage: Mapping[str, float], running: Iterable[RunningJob], t: float
) -> dict[str, float]:
    """Each user's decayed usage plus what their running jobs have held up to `t`."""
    current = dict(usage)
    for r in running:
        current[r.user] = current.get(r.user, 0.0) + (t - r.start_time) * len(r.gpu_ids)
    return current


def _jain_index(xs: Sequence[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


HORIZONS = (("within_1h", 3600.0), ("within_1d", 86_400.0), ("later", math.inf))


def _eta_errors_by_horizon(done: Sequence[SimJob]) -> dict[str, float | None]:
    """Median |estimated - actual start| for jobs that waited, by how long they waited."""
    groups: dict[str, list[float]] = {name: [] for name, _ in HORIZONS}
    for j in done:
        if j.eta is None or _start(j) <= j.submit:
            continue
        wait = _start(j) - j.submit
        name = next(n for n, limit in HORIZONS if wait <= limit)
        groups[name].append(abs(j.eta - _start(j)))
    return {n: _round(statistics.median(v)) if v else None for n, v in groups.items()}


def _lead_ratio_band(done: Sequence[SimJob]) -> tuple[float, float] | None:
    """For jobs estimated to wait over an hour: the quartiles of actual wait / estimated
    wait (what the portal's "likely between" range is drawn from: half the jobs)."""
    ratios = [
        (_start(j) - j.submit) / (j.eta - j.submit)
        for j in done
        if j.eta is not None and j.eta - j.submit > LONG_LEAD_S
    ]
    if len(ratios) < 10:
        return None
    low, high = _percentile(ratios, 25), _percentile(ratios, 75)
    assert low is not None and high is not None
    return (round(low, 3), round(high, 3))


LONG_LEAD_S = 3600.0


def _near_delay_band(done: Sequence[SimJob]) -> tuple[float, float] | None:
    """For jobs estimated to start within the hour: the quartiles of actual start minus
    estimated start, in seconds (what the portal's range for near estimates is drawn
    from). By the estimate's lead, as the member sees it, not by the wait it turned into."""
    delays = [
        _start(j) - j.eta for j in done if j.eta is not None and 0 < j.eta - j.submit <= LONG_LEAD_S
    ]
    if len(delays) < 10:
        return None
    low, high = _percentile(delays, 25), _percentile(delays, 75)
    assert low is not None and high is not None
    return (round(low), round(high))


def _start(job: SimJob) -> float:
    assert job.start is not None
    return job.start


def _end(job: SimJob) -> float:
    assert job.end is not None
    return job.end


def _spread(
    windows: list[dict[str, float]], user: str, start: float, end: float, gpus: float, t0: float
) -> None:
    first = int((start - t0) // FAIRNESS_WINDOW_S)
    last = min(len(windows) - 1, int((end - t0) // FAIRNESS_WINDOW_S))
    for w in range(first, last + 1):
        lo = max(start, t0 + w * FAIRNESS_WINDOW_S)
        hi = min(end, t0 + (w + 1) * FAIRNESS_WINDOW_S)
        if hi > lo:
            windows[w][user] = windows[w].get(user, 0.0) + (hi - lo) * gpus


def _water_fill(
    demand: dict[str, float], weight: dict[str, float], capacity: float
) -> dict[str, float]:
    """Weighted max-min fair split of ``capacity``: nobody gets more than they asked for."""
    fair: dict[str, float] = {}
    active = sorted(demand, key=lambda u: demand[u] / weight[u])
    left = capacity
    total_weight = sum(weight[u] for u in active)
    for u in active:
        share = left * weight[u] / total_weight if total_weight > 0 else 0.0
        give = min(demand[u], share)
        fair[u] = give
        left -= give
        total_weight -= weight[u]
    return fair


def _percentile(values: Sequence[float], pct: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * pct / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def simulate(
    trace: str,
    policy: str,
    *,
    gpus: int = 32,
    gpus_per_node: int = 8,
    users: int = 30,
    seed: int = 1,
    load: float = 1.0,
    window: str = "auto",
    max_jobs: int | None = None,
    slot_gpus: int = 1,
    slots_per_gpu: int = 4,
    timeslot_s: float = 4 * 3600.0,
) -> dict[str, Any]:
    """Replay ``trace`` under ``policy`` and return the metrics (the ``--json`` object)."""
    workload = load_workload(
        trace,
        users=users,
        seed=seed,
        load=load,
        window=window,
        max_jobs=max_jobs,
        max_gpus_per_job=gpus_per_node,
    )
    return Simulation(
        workload,
        policy,
        gpus=gpus,
        per_node=gpus_per_node,
        slot_gpus=slot_gpus,
        slots_per_gpu=slots_per_gpu,
        timeslot_s=timeslot_s,
    ).run()


def format_table(results: Iterable[dict[str, Any]]) -> str:
    """Metrics side by side, one column per policy."""
    results = list(results)
    keys = [k for k in results[0] if k != "policy"]
    width = max(len(k) for k in keys) + 2

    def cell(value: object) -> str:
        if isinstance(value, dict):
            return " ".join(f"{q}={v}" for q, v in value.items())
        return str(value)

    column = max(16, *(len(cell(r[k])) + 2 for r in results for k in keys))
    lines = ["".ljust(width) + "".join(str(r["policy"]).rjust(column) for r in results)]
    for key in keys:
        lines.append(key.ljust(width) + "".join(cell(r[key]).rjust(column) for r in results))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; prints a table, or one JSON object per policy."""
    parser = argparse.ArgumentParser(
        prog="python -m scheduler.simulate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--trace", required=True)
    parser.add_argument("--gpus", type=int, default=32)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--policy", default="labportal", choices=(*POLICIES, "all"))
    parser.add_argument("--users", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--load", type=float, default=1.0)
    parser.add_argument(
        "--window",
        default="auto",
        help="auto (skip a sparse head; the default) | dense | all | START:END (trace seconds)",
    )
    parser.add_argument("--max-jobs", type=int, default=None)
    parser.add_argument("--slot-gpus", type=int, default=1, help="GPUs exposed as shared slots")
    parser.add_argument("--slots-per-gpu", type=int, default=4)
    parser.add_argument("--timeslot-hours", type=float, default=4.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not Path(args.trace).is_file():
        parser.error(f"--trace {args.trace} is not a file; give the path of a trace CSV")
    policies = POLICIES if args.policy == "all" else (args.policy,)
    results = []
    for name in policies:
        try:
            result = simulate(
                args.trace,
                name,
                gpus=args.gpus,
                gpus_per_node=args.gpus_per_node,
                users=args.users,
                seed=args.seed,
                load=args.load,
                window=args.window,
                max_jobs=args.max_jobs,
                slot_gpus=args.slot_gpus,
                slots_per_gpu=args.slots_per_gpu,
                timeslot_s=args.timeslot_hours * 3600.0,
            )
        except EmptyWorkload as exc:
            print(f"simulate: {exc}", file=sys.stderr)
            return 2
        results.append(result)
        if args.json:
            print(json.dumps(result), flush=True)
    if not args.json:
        print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

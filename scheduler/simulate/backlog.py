"""What the incremental replay keeps between events, so that a pass needs only the head
of the backlog: the pending jobs in scheduling order and by class (``_Backlog``), the
free units counted generously (``_FreeUnits``), and what a pass's failures prove about
the jobs behind them (``_witnesses``)."""

from __future__ import annotations

import bisect
import heapq
import math
from collections import Counter
from collections.abc import Iterable, Sequence

from scheduler.model import Gpu, GpuKind, Node, NodeState, PendingJob, Plan, Policy, Reason
from scheduler.priority import RankedJob, Ranker, short_level

# Reasons a pass gives a job whose placement failed (not a limit, not a hold).
PLACEMENT_FAILED = frozenset(
    {Reason.RESOURCES, Reason.PRIORITY, Reason.RESERVATION, Reason.NO_CREDIT}
)
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
            # Arrivals come in (submit, id) order, so appending keeps each group sorted; a
            # preempted job comes back with its original submit time and is put in place.
            group = self.groups.setdefault(self._group(job), [])
            jobs = self.jobs
            if group and (jobs[group[-1]].submit_time, group[-1]) > (job.submit_time, job.id):
                bisect.insort(group, job.id, key=lambda i: (jobs[i].submit_time, i))
            else:
                group.append(job.id)
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

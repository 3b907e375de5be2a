"""The scheduling engine: one pure function, ``plan(state, policy, now) -> Plan``.

A pass has two halves:

1. **Decisions**, judged by time limits. Jobs are taken in order (see ``priority``).
   A job starts if it passes its limits and fits now on one node without running
   into a reservation of someone else or a backfill guarantee; a job longer than the
   drain horizon must also leave enough wide nodes draining (the drain reserve). The first
   ``policy.backfill_depth`` jobs that do not fit get a guarantee: the earliest start
   the time limits allow, on named GPUs, which later jobs may not delay (EASY).
   Emergency jobs and reservation jobs inside their window may requeue preemptible
   jobs. Where the policy allows it, so may a job that has starved (waited past
   ``preempt_starving_after_s``) and a job of a member at or under their fair share
   (waited past ``preempt_share_after_s``; only jobs of members over their share, and
   further over it, are stopped for it); those two stop only other members' preemptible
   jobs that have run ``preempt_min_run_s`` and been preempted fewer than
   ``preempt_max_times`` times. Nothing else is ever preempted, and a job
   marked preemptible never preempts for a reason of its own.
2. **Estimates**, judged by predicted run times. Every job that stays pending is
   played forward in order onto the earliest GPUs that free up (``scheduler.forecast``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from functools import cached_property

from scheduler.fairshare import fairshare_factors
from scheduler.forecast import GUARANTEE, INF, Block, LimitKey, _Forecast
from scheduler.model import (
    ClusterState,
    Gpu,
    GpuKind,
    Guarantee,
    Node,
    NodeState,
    PendingInfo,
    PendingJob,
    Plan,
    Policy,
    Preemption,
    Reason,
    Reservation,
    RunningJob,
    Start,
)
from scheduler.priority import TIER_RESERVATION, rank_pending

# Reasons a job of a user with credit, waiting ahead in the same tier, also has: there a
# job at zero credit waits because credit orders the tier (scheduler/priority.py).
CREDIT_ORDERED = frozenset({Reason.RESOURCES, Reason.PRIORITY})
# The fair-share factor 2^(-usage/share) of a member whose usage equals their share.
AT_SHARE = 0.5


def plan(state: ClusterState, policy: Policy, now: float, *, estimates: bool = True) -> Plan:
    """Decide what starts now, what is preempted, and where every pending job stands.

    Pure and deterministic: equal inputs give equal plans. ``estimates=False`` skips the
    forward play (estimated starts are then ``None``), for callers that do not show them.
    """
    return _Pass(state, policy, now).run(estimates)


def limit_keys(
    policy: Policy, user: str, queue: str, category: str
) -> list[tuple[LimitKey, int, bool, Reason]]:
    """The concurrency limits a job of (user, queue, category) is counted against:
    (key, cap, counts units rather than jobs, reason when exceeded)."""
    keys: list[tuple[LimitKey, int, bool, Reason]] = []
    q = policy.queues.get(queue)
    if q is not None:
        jobs_cap, gpus_cap = user_queue_caps(policy, queue, category)
        if jobs_cap is not None:
            keys.append((("uqj", user, queue), jobs_cap, False, Reason.USER_LIMIT))
        if gpus_cap is not None:
            keys.append((("uqg", user, queue), gpus_cap, True, Reason.USER_LIMIT))
        if q.max_running_gpus is not None:
            keys.append((("qg", queue), q.max_running_gpus, True, Reason.QUEUE_LIMIT))
    if policy.max_running_gpus_per_user is not None:
        keys.append((("ug", user), policy.max_running_gpus_per_user, True, Reason.USER_LIMIT))
    cat = policy.categories.get(category)
    if cat is not None:
        if cat.max_gpus_per_user is not None:
            keys.append(
                (("cu", category, user), cat.max_gpus_per_user, True, Reason.CATEGORY_LIMIT)
            )
        if cat.max_gpus_total is not None:
            keys.append((("ct", category), cat.max_gpus_total, True, Reason.CATEGORY_LIMIT))
    return keys


def user_queue_caps(policy: Policy, queue: str, category: str) -> tuple[int | None, int | None]:
    """A member's (running jobs, running GPUs) caps in a queue: their category's allowance
    where it sets one, else the queue's."""
    q = policy.queues.get(queue)
    if q is None:
        return None, None
    cat = policy.categories.get(category)
    own = cat.queues.get(queue) if cat is not None else None
    if own is None:
        return q.max_running_jobs_per_user, q.max_running_gpus_per_user
    return (
        own.max_running_jobs_per_user
        if own.max_running_jobs_per_user is not None
        else q.max_running_jobs_per_user,
        own.max_running_gpus_per_user
        if own.max_running_gpus_per_user is not None
        else q.max_running_gpus_per_user,
    )


def forget_topology() -> None:
    """Drop the kept topology (benchmarks time a pass as the portal runs it: cold)."""
    _Topology._last = None


class _Topology:
    """The parts of a pass that depend only on the nodes and GPUs, index-addressed.

    Read-only once built. The simulator passes the same node and GPU tuples to every
    pass, so the last topology is kept (holding those tuples, so that identity means
    equality); the portal builds new tuples each pass and gets a fresh one.
    """

    _last: _Topology | None = None

    def __init__(self, nodes: tuple[Node, ...], units: tuple[Gpu, ...]) -> None:
        self.nodes = nodes
        self.units = units
        node_state = {n.name: n.state for n in nodes}
        gpus = sorted(units, key=lambda g: (g.node, g.id))
        node_names = sorted({g.node for g in gpus})
        self.node_names = node_names
        node_index = {name: i for i, name in enumerate(node_names)}
        self.node_usable = [node_state.get(name) == NodeState.UP for name in node_names]
        self.unit_ids = [g.id for g in gpus]
        self.unit_index = {g.id: i for i, g in enumerate(gpus)}
        n = len(gpus)
        self.unit_node = [node_index[g.node] for g in gpus]
        class_keys: dict[tuple[str, str, int], int] = {}
        self.unit_class: list[int] = []
        for g in gpus:
            key = (str(g.kind), g.model, g.memory_mb)
            self.unit_class.append(class_keys.setdefault(key, len(class_keys)))
        self.classes = list(class_keys)
        self.unit_parent_key = [g.parent or g.id for g in gpus]
        self.node_units: list[list[int]] = [[] for _ in node_names]
        for i in range(n):
            self.node_units[self.unit_node[i]].append(i)
        # Units that share a physical GPU with a unit listed in the same input conflict.
        self.conflicts: list[tuple[int, ...]] = [()] * n
        for i, g in enumerate(gpus):
            if g.parent is not None and g.parent in self.unit_index:
                p = self.unit_index[g.parent]
                self.conflicts[i] = (*self.conflicts[i], p)
                self.conflicts[p] = (*self.conflicts[p], i)
        # Answers that depend on the topology alone, shared by the passes that reuse it.
        self.class_cache: dict[tuple[bool, bool, str | None, int], tuple[int, ...]] = {}
        self.static_cache: dict[tuple[tuple[int, ...], int], Reason | None] = {}

    @classmethod
    def of(cls, state: ClusterState) -> _Topology:
        last = cls._last
        if last is not None and last.nodes is state.nodes and last.units is state.gpus:
            return last
        topo = cls._last = cls(state.nodes, state.gpus)
        return topo


class _Pass:
    """State of one planning pass over flat, index-addressed arrays (for speed)."""

    def __init__(self, state: ClusterState, policy: Policy, now: float) -> None:
        self.state = state
        self.policy = policy
        self.now = now
        self.reservations = {r.id: r for r in state.reservations}

        topo = _Topology.of(state)
        self.node_names = topo.node_names
        self.node_usable = topo.node_usable
        self.unit_ids = topo.unit_ids
        self.unit_index = topo.unit_index
        n = len(topo.unit_ids)
        self.unit_node = topo.unit_node
        self.unit_class = topo.unit_class
        self.classes = topo.classes
        self.unit_parent_key = topo.unit_parent_key
        self.node_units = topo.node_units
        self.conflicts = topo.conflicts
        node_names = self.node_names

        self.busy = [False] * n
        self.holder: list[int | None] = [None] * n
        self.avail_limit = [now] * n
        self.avail_pred = [now] * n
        self.running_by_id = {job.id: job for job in state.running}
        for job in sorted(state.running, key=lambda j: j.id):
            end_limit, end_pred = self._running_ends(
                job.start_time, job.time_limit_s, job.predicted_runtime_s
            )
            for gid in job.gpu_ids:
                u = self.unit_index.get(gid)
                if u is None:
                    continue
                for v in (u, *self.conflicts[u]):
                    self.busy[v] = True
                    self.avail_limit[v] = max(self.avail_limit[v], end_limit)
                    self.avail_pred[v] = max(self.avail_pred[v], end_pred)
                self.holder[u] = job.id

        self.blocks: list[list[Block] | None] = [None] * n
        for res in sorted(state.reservations, key=lambda r: r.id):
            if res.end <= now:
                continue
            for gid in res.gpu_ids:
                u = self.unit_index.get(gid)
                if u is None:
                    continue
                for v in (u, *self.conflicts[u]):
                    lst = self.blocks[v]
                    if lst is None:
                        lst = self.blocks[v] = []
                    lst.append((res.start, res.end, res.id))
        for lst in self.blocks:
            if lst is not None:
                lst.sort()

        self.node_release = [now] * len(node_names)
        for u in range(n):
            if self.busy[u]:
                node = self.unit_node[u]
                self.node_release[node] = max(self.node_release[node], self.avail_limit[u])

        # Free units per usable node, and nodes bucketed by their free count so that
        # best fit (fewest free units first) is a short scan.
        self.node_free: list[list[int]] = [[] for _ in node_names]
        for i in range(n):
            if not self.busy[i] and self.node_usable[self.unit_node[i]]:
                self.node_free[self.unit_node[i]].append(i)
        self.buckets: dict[int, list[int]] = {}
        for node, free in enumerate(self.node_free):
            if free:
                self.buckets.setdefault(len(free), []).append(node)

        self.largest_node_units = max((len(u) for u in self.node_units), default=0)
        self._init_drain_reserve()
        self._limit_cache: dict[tuple[str, str, str], list[tuple[LimitKey, int, bool, Reason]]] = {}
        self.counters: dict[LimitKey, int] = {}
        for job in state.running:
            self.count(job.user, job.queue, job.category, len(job.gpu_ids))
        # Limit budget promised to guaranteed jobs: (start, limit keys, units).
        self.promised: list[tuple[float, set[LimitKey], int]] = []

        self._class_cache = topo.class_cache
        self._static_cache = topo.static_cache
        self._fail_cache: dict[tuple[tuple[int, ...], int, float, bool], Reason] = {}
        self._no_free: dict[tuple[int, ...], int] = {}
        self.victims: set[int] = set()

    def _init_drain_reserve(self) -> None:
        """Drain reserve: the wide nodes (up, with the most whole GPUs) are the only ones
        that can run the widest jobs, so long jobs may not stop all of them from draining.

        A wide node is *pinned* when something on it runs, by its limit, past
        ``now + drain_horizon_s`` (or a guaranteed long job will start there); the others
        drain within the horizon. A long job (limit beyond the horizon) may not pin a
        draining wide node if that leaves no more than the reserve draining.
        """
        policy = self.policy
        n_nodes = len(self.node_names)
        whole = [0] * n_nodes
        for u, node in enumerate(self.unit_node):
            if self.classes[self.unit_class[u]][0] == GpuKind.WHOLE:
                whole[node] += 1
        widest = max((w for node, w in enumerate(whole) if self.node_usable[node]), default=0)
        self.widest = widest
        self.wide_node = [
            widest > 0 and self.node_usable[node] and whole[node] == widest
            for node in range(n_nodes)
        ]
        wide = sum(self.wide_node)
        horizon = policy.drain_horizon_s
        if horizon is None or policy.drain_reserve_nodes <= 0 or wide < 2:
            self.drain_long = INF  # no job is long: the rule never applies
            self.reserve_wide = self.reserve_narrow = 0
        else:
            self.drain_long = horizon
            self.reserve_wide = min(policy.drain_reserve_nodes, wide - 1)
            self.reserve_narrow = min(policy.drain_reserve_nodes + 1, wide - 1)
        self.drain_at = self.now + self.drain_long
        self.pinned = [
            not self.wide_node[node] or self.node_release[node] > self.drain_at
            for node in range(n_nodes)
        ]
        self.draining = self.pinned.count(False)
        self._hint_cache: dict[tuple[tuple[int, ...], int], float | None] = {}

    def drain_hint(self, classes: tuple[int, ...], k: int) -> float | None:
        """For a long job the reserve holds back: the earliest time, by predicted run
        times, that k units free up on one node it may pin (for its estimate).
        Memoised per request shape: it only feeds estimates, which err late anyway."""
        key = (classes, k)
        if key in self._hint_cache:
            return self._hint_cache[key]
        best: float | None = None
        for node, cand in self.candidate_nodes(classes):
            if len(cand) < k or not self.keeps_drain_reserve(node, k):
                continue
            t = sorted(self.avail_pred[u] if self.busy[u] else self.now for u in cand)[k - 1]
            if best is None or t < best:
                best = t
        self._hint_cache[key] = best
        return best

    def keeps_drain_reserve(self, node: int, k: int) -> bool:
        """May a long job of k units pin ``node``? Yes if the node is not a draining
        wide node, or enough other wide nodes still drain: the reserve, plus one more
        for a job smaller than a wide node (that one is left for long wide jobs, which
        have nowhere else to go)."""
        if self.pinned[node]:
            return True
        reserve = self.reserve_wide if k >= self.widest else self.reserve_narrow
        return self.draining > reserve

    def pin(self, node: int) -> None:
        if not self.pinned[node]:
            self.pinned[node] = True
            self.draining -= 1

    # ----------------------------------------------------------------- helpers
    def _running_ends(
        self, start: float, limit: float, predicted: float | None
    ) -> tuple[float, float]:
        """End of a running job by its limit and by its prediction (capped at the limit).

        A job past its limit is assumed to stop soon: "warn, don't kill" lets it overrun.
        A job past its predicted end but within its limit is expected to end
        ``overrun_predicted_s`` from now (estimates only; jobs that outrun their
        prediction mostly run on for a while, and assuming the limit's short overrun made
        short-horizon estimates early).
        """
        end_limit = start + limit
        if end_limit <= self.now:
            end_limit = self.now + self.policy.overrun_assumed_s
        runtime = min(predicted, limit) if predicted is not None else limit
        end_pred = start + runtime
        if end_pred <= self.now:
            end_pred = min(end_limit, self.now + self.policy.overrun_predicted_s)
        return end_limit, end_pred

    def matching_classes(self, job: PendingJob) -> tuple[int, ...]:
        """Unit classes a job may use: slots for slot jobs; whole GPUs, and MIG instances
        for single-unit jobs that state a memory or model need."""
        key = (job.shared_slot, job.gpus == 1, job.gpu_model, job.min_memory_mb)
        cached = self._class_cache.get(key)
        if cached is not None:
            return cached
        ok: list[int] = []
        for c, (kind, model, memory) in enumerate(self.classes):
            if job.shared_slot:
                if kind != GpuKind.SLOT:
                    continue
            elif (
                kind == GpuKind.SLOT
                or kind == GpuKind.MIG
                and not (job.gpus == 1 and (job.min_memory_mb > 0 or job.gpu_model))
            ):
                continue
            if job.gpu_model and model != job.gpu_model:
                continue
            if memory < job.min_memory_mb:
                continue
            ok.append(c)
        result = tuple(ok)
        self._class_cache[key] = result
        return result

    @staticmethod
    def units_needed(job: PendingJob) -> int:
        return 1 if job.shared_slot else max(1, job.gpus)

    def static_reason(self, classes: tuple[int, ...], k: int) -> Reason | None:
        """CONSTRAINTS if no node could ever hold the job, NODE_UNAVAILABLE if only
        draining/down nodes could, else None."""
        key = (classes, k)
        if key in self._static_cache:
            return self._static_cache[key]
        allowed = set(classes)
        reason: Reason | None = Reason.CONSTRAINTS
        for node, units in enumerate(self.node_units):
            if sum(1 for u in units if self.unit_class[u] in allowed) >= k:
                if self.node_usable[node]:
                    reason = None
                    break
                reason = Reason.NODE_UNAVAILABLE
        self._static_cache[key] = reason
        return reason

    def blocked(self, u: int, start: float, end: float, owner: int, kinds: int = 3) -> bool:
        """Does a block on unit ``u`` overlap [start, end) for a job of reservation
        ``owner`` (-2 for none)? ``kinds``: 1 reservations, 2 guarantees, 3 both."""
        lst = self.blocks[u]
        if lst is None:
            return False
        for s, e, who in lst:
            if s >= end:
                break
            if e <= start or who == owner:
                continue
            if who == GUARANTEE:
                if kinds & 2:
                    return True
            elif kinds & 1:
                return True
        return False

    def add_block(self, u: int, block: Block) -> None:
        lst = self.blocks[u]
        if lst is None:
            self.blocks[u] = [block]
        else:
            bisect.insort(lst, block)

    def _order_units(self, cand: list[int], k: int) -> list[int]:
        """Pick k units: smallest memory that fits, then the most-packed physical GPU
        (shared slots and MIG), then units with future bookings (fill gaps), then id."""
        if len(cand) == k and k == 1:
            return cand
        free_per_parent: dict[str, int] = {}
        for u in cand:
            key = self.unit_parent_key[u]
            free_per_parent[key] = free_per_parent.get(key, 0) + 1
        cand = sorted(
            cand,
            key=lambda u: (
                self.classes[self.unit_class[u]][2],
                free_per_parent[self.unit_parent_key[u]],
                0 if self.blocks[u] is not None else 1,
                u,
            ),
        )
        return cand[:k]

    # --------------------------------------------------------------- placement
    def place_now(
        self,
        classes: tuple[int, ...],
        k: int,
        limit: float,
        owner: int,
        kinds: int = 3,
        drain: bool = False,
    ) -> list[int] | None:
        """Units on the best-fit node where a job could start now, or None.

        Best fit: a partly used node before an idle one (keeps whole nodes for large
        jobs); among those, the node with the fewest free units (packing: small jobs fill
        the fullest node, so free units gather on few nodes and wide jobs find room);
        then the node whose release (its last job's end by limit) the job extends
        least, so that long jobs gather and other nodes drain. ``drain``: the job is
        long, so only nodes that keep the drain reserve are considered.
        """
        allowed = set(classes)
        end = self.now + limit
        best_key: tuple[int, int, float, int] | None = None
        best: list[int] | None = None
        for count in sorted(self.buckets):
            if count < k:
                continue
            if best_key is not None and best_key[0] == 0 and count > best_key[1]:
                break  # a partly used node with fewer free units was found: nothing beats it
            for node in self.buckets[count]:
                idle = 1 if count == len(self.node_units[node]) else 0
                if best_key is not None and idle > best_key[0]:
                    continue
                if drain and not self.keeps_drain_reserve(node, k):
                    continue
                cand = [
                    u
                    for u in self.node_free[node]
                    if self.unit_class[u] in allowed
                    and (self.blocks[u] is None or not self.blocked(u, self.now, end, owner, kinds))
                ]
                if len(cand) < k:
                    continue
                key = (idle, count, max(0.0, end - self.node_release[node]), node)
                if best_key is None or key < best_key:
                    best_key, best = key, cand
                    if idle == 0 and key[2] == 0.0:
                        return self._order_units(cand, k)
        return self._order_units(best, k) if best is not None else None

    def place_in(
        self, units: Iterable[int], classes: tuple[int, ...], k: int, limit: float, owner: int
    ) -> list[int] | None:
        """Place a job on a subset of units (its reservation's), best fit by node."""
        allowed = set(classes)
        end = self.now + limit
        per_node: dict[int, list[int]] = {}
        for u in units:
            if (
                not self.busy[u]
                and self.node_usable[self.unit_node[u]]
                and self.unit_class[u] in allowed
                and not self.blocked(u, self.now, end, owner)
            ):
                per_node.setdefault(self.unit_node[u], []).append(u)
        best: tuple[int, int] | None = None
        for node, cand in per_node.items():
            if len(cand) >= k:
                key = (len(self.node_free[node]), node)
                if best is None or key < best:
                    best = key
        if best is None:
            return None
        return self._order_units(per_node[best[1]], k)

    def take(
        self, units: Sequence[int], until_limit: float, until_pred: float, holder: int
    ) -> None:
        """Mark units (and the units sharing their physical GPU) busy from now."""
        for u in units:
            for v in (u, *self.conflicts[u]):
                if self.busy[v]:
                    self.avail_limit[v] = max(self.avail_limit[v], until_limit)
                    self.avail_pred[v] = max(self.avail_pred[v], until_pred)
                    continue
                self.busy[v] = True
                self.avail_limit[v] = until_limit
                self.avail_pred[v] = until_pred
                node = self.unit_node[v]
                free = self.node_free[node]
                if v in free:
                    old = len(free)
                    free.remove(v)
                    bucket = self.buckets[old]
                    bucket.remove(node)
                    if not bucket:
                        del self.buckets[old]
                    if free:
                        bisect.insort(self.buckets.setdefault(len(free), []), node)
            self.holder[u] = holder
            node = self.unit_node[u]
            self.node_release[node] = max(self.node_release[node], until_limit)
            if until_limit > self.drain_at:
                self.pin(node)

    def earliest(
        self, units_by_node: Iterable[tuple[int, list[int]]], k: int, limit: float, owner: int
    ) -> tuple[float, list[int]] | None:
        """Earliest start, judged by time limits, with k units on one node free for
        ``limit`` seconds and clear of blocks; and those units."""
        best_t = INF
        best_units: list[int] | None = None
        for _node, cand in units_by_node:
            if len(cand) < k:
                continue
            free_at = {u: self.avail_limit[u] if self.busy[u] else self.now for u in cand}
            # Times at which fewer than k units are free cannot start the job: the k-th
            # earliest free time is a lower bound, checked before the block lists.
            kth = sorted(free_at.values())[k - 1]
            if kth >= best_t:
                continue
            times = sorted(
                {f for f in free_at.values() if f >= kth}
                | {e for u in cand for (_s, e, _w) in (self.blocks[u] or ()) if e > kth}
            )
            for t in times:
                if t >= best_t:
                    break
                ok = [
                    u for u in cand if free_at[u] <= t and not self.blocked(u, t, t + limit, owner)
                ]
                if len(ok) >= k:
                    best_t = t
                    best_units = self._order_units(ok, k)
                    break
        if best_units is None:
            return None
        return best_t, best_units

    def candidate_nodes(
        self, classes: tuple[int, ...], restrict: Iterable[int] | None = None
    ) -> list[tuple[int, list[int]]]:
        allowed = set(classes)
        if restrict is not None:
            per_node: dict[int, list[int]] = {}
            for u in restrict:
                if self.node_usable[self.unit_node[u]] and self.unit_class[u] in allowed:
                    per_node.setdefault(self.unit_node[u], []).append(u)
            return sorted(per_node.items())
        return [
            (node, [u for u in units if self.unit_class[u] in allowed])
            for node, units in enumerate(self.node_units)
            if self.node_usable[node]
        ]

    def preempt_for(
        self,
        job: PendingJob,
        classes: tuple[int, ...],
        k: int,
        restrict: Iterable[int] | None,
        owner: int,
        cause: str = "emergency",
    ) -> tuple[list[int], list[int]] | None:
        """Units for ``job`` if preemptible jobs on them were requeued: (units, victims).

        Only jobs ``may_stop`` allows for ``cause`` are victims. Picks the node needing the
        fewest victims, then the fewest victim GPUs."""
        allowed = set(classes)
        end = self.now + job.time_limit_s
        best: tuple[tuple[int, int, int], list[int], list[int]] | None = None
        for node, cand in self.candidate_nodes(classes, restrict):
            usable: list[int] = []
            victims: dict[int, int] = {}
            for u in cand:
                if self.unit_class[u] not in allowed or self.blocked(u, self.now, end, owner):
                    continue
                if not self.busy[u]:
                    usable.append(u)
                    continue
                holder = self.holder[u]
                running = self.running_by_id.get(holder) if holder is not None else None
                if (
                    running is None
                    or not running.preemptible
                    or (owner >= 0 and running.reservation_id == owner)
                    or holder in self.victims
                    or not self.may_stop(running, job, cause)
                ):
                    continue
                usable.append(u)
                victims[running.id] = victims.get(running.id, 0) + 1
            if len(usable) < k:
                continue
            # Free units first, then units of the smallest victims.
            usable.sort(
                key=lambda u: (
                    0 if not self.busy[u] else 1,
                    victims.get(h, 0) if (h := self.holder[u]) is not None else 0,
                    u,
                )
            )
            chosen = usable[:k]
            chosen_victims = sorted(
                {h for u in chosen if self.busy[u] and (h := self.holder[u]) is not None}
            )
            cost = (
                len(chosen_victims),
                sum(len(self.running_by_id[v].gpu_ids) for v in chosen_victims),
                node,
            )
            if best is None or cost < best[0]:
                best = (cost, chosen, chosen_victims)
        if best is None or not best[2]:
            return None
        return best[1], best[2]

    @cached_property
    def share_factors(self) -> dict[str, float]:
        """Each member's fair-share factor (empty without a share tree); asked for only when
        a job may preempt for a member's share."""
        tree = self.state.share_tree
        return fairshare_factors(tree, self.state.usage) if tree is not None else {}

    def preemption_cause(self, job: PendingJob, restrict: list[int] | None) -> str | None:
        """Why ``job``, which cannot start now, may requeue preemptible jobs; None: it may not."""
        if job.emergency:
            return "emergency"
        if restrict is not None:
            return "reservation"
        if job.preemptible:
            return None
        policy = self.policy
        waited = self.now - job.submit_time
        starving = policy.preempt_starving_after_s
        if starving is not None and waited >= starving:
            return "starving"
        share_after = policy.preempt_share_after_s
        if share_after is not None and waited >= share_after:
            factor = self.share_factors.get(job.user)
            if factor is not None and factor >= AT_SHARE:
                return "share"
        return None

    def may_stop(self, victim: RunningJob, job: PendingJob, cause: str) -> bool:
        """Whether ``victim`` (preemptible) may be requeued for ``job`` for ``cause``.

        Emergencies and bookings take any preemptible job, as before. A starving job or a
        member's share takes only another member's job that has run its minimum, outside
        any booking or emergency, and preempted fewer than ``preempt_max_times`` times; for a
        share, only one of a member over their share and further over it than ``job``'s
        owner."""
        if cause in ("emergency", "reservation"):
            return True
        if (
            victim.user == job.user
            or victim.emergency
            or victim.reservation_id is not None
            or self.now - victim.start_time < self.policy.preempt_min_run_s
            or self.stopped_enough(victim)
        ):
            return False
        if cause == "share":
            theirs = self.share_factors.get(victim.user, 0.0)
            return theirs < AT_SHARE and theirs < self.share_factors.get(job.user, 0.0)
        return True

    def stopped_enough(self, victim: RunningJob) -> bool:
        """Whether ``victim`` has been preempted as often as the policy allows for a starving
        job or a member's share (a cap on churn: each stop costs it a restart)."""
        cap = self.policy.preempt_max_times
        return cap is not None and victim.preemptions >= cap

    # ----------------------------------------------------------------- limits
    def per_job_limit(self, job: PendingJob, k: int) -> Reason | None:
        """A reason the job can never run under its queue's and user's limits."""
        queue = self.policy.queues.get(job.queue)
        if queue is not None:
            if queue.max_gpus_per_job is not None and k > queue.max_gpus_per_job:
                return Reason.QUEUE_LIMIT
            if queue.max_wall_s is not None and job.time_limit_s > queue.max_wall_s:
                return Reason.QUEUE_LIMIT
            if queue.max_running_gpus is not None and k > queue.max_running_gpus:
                return Reason.QUEUE_LIMIT
            jobs_cap, gpus_cap = user_queue_caps(self.policy, job.queue, job.category)
            if gpus_cap is not None and k > gpus_cap:
                return Reason.USER_LIMIT
            if jobs_cap == 0:
                return Reason.USER_LIMIT
        if self.policy.max_running_gpus_per_user is not None and (
            k > self.policy.max_running_gpus_per_user
        ):
            return Reason.USER_LIMIT
        category = self.policy.categories.get(job.category)
        if category is not None and (
            (category.max_gpus_per_user is not None and k > category.max_gpus_per_user)
            or (category.max_gpus_total is not None and k > category.max_gpus_total)
        ):
            return Reason.CATEGORY_LIMIT
        return None

    def limits_of(
        self, user: str, queue: str, category: str
    ) -> list[tuple[LimitKey, int, bool, Reason]]:
        """``limit_keys``, memoised: a pass asks for the same few triples many times."""
        triple = (user, queue, category)
        keys = self._limit_cache.get(triple)
        if keys is None:
            keys = self._limit_cache[triple] = limit_keys(self.policy, user, queue, category)
        return keys

    def count(self, user: str, queue: str, category: str, units: int) -> None:
        for key, _cap, per_unit, _reason in self.limits_of(user, queue, category):
            self.counters[key] = self.counters.get(key, 0) + (units if per_unit else 1)

    def running_limit(self, job: PendingJob, k: int) -> Reason | None:
        """A reason the job may not start now because of what already runs, or because
        it would still run at a guaranteed start whose limit budget it shares."""
        end = self.now + job.time_limit_s
        for key, cap, per_unit, reason in self.limits_of(job.user, job.queue, job.category):
            used = self.counters.get(key, 0) + (k if per_unit else 1)
            for start, keys, units in self.promised:
                if start < end and key in keys:
                    used += units if per_unit else 1
            if used > cap:
                return reason
        return None

    # -------------------------------------------------------------------- run
    def run(self, estimates: bool) -> Plan:
        policy = self.policy
        now = self.now
        ranked = rank_pending(self.state, policy, now, self.reservations, self.largest_node_units)
        starts: list[Start] = []
        preemptions: list[Preemption] = []
        reasons: dict[int, Reason] = {}
        never: set[int] = set()
        started: dict[int, list[int]] = {}
        preempting: dict[int, list[int]] = {}
        guarantees: dict[int, Guarantee] = {}
        guarantees_left = policy.backfill_depth if policy.backfill else 0
        drain_held: dict[int, float] = {}  # long jobs held back by the drain reserve
        strict_blocked = False

        for item in ranked:
            job = item.job
            k = self.units_needed(job)
            classes = self.matching_classes(job)
            if job.held:
                reasons[job.id] = Reason.HELD
                never.add(job.id)
                continue
            static = self.static_reason(classes, k)
            per_job = self.per_job_limit(job, k) if not job.emergency else None
            if static is not None or per_job is not None:
                reasons[job.id] = static or per_job or Reason.CONSTRAINTS
                never.add(job.id)
                continue
            if job.depends_on:
                # Not before the jobs it waits for: no start, no guarantee; the forecast
                # places it after their expected ends.
                reasons[job.id] = Reason.DEPENDENCY
                continue

            reservation: Reservation | None = None
            restrict: list[int] | None = None
            owner = -2
            if job.reservation_id is not None:
                reservation = self.reservations.get(job.reservation_id)
                if reservation is None or reservation.user != job.user or reservation.end <= now:
                    reasons[job.id] = Reason.RESERVATION
                    never.add(job.id)
                    continue
                owner = reservation.id
                restrict = sorted(
                    self.unit_index[g] for g in reservation.gpu_ids if g in self.unit_index
                )
                if (
                    sum(
                        1
                        for _n, units in self.candidate_nodes(classes, restrict)
                        if len(units) >= k
                    )
                    == 0
                ):
                    reasons[job.id] = Reason.CONSTRAINTS
                    never.add(job.id)
                    continue
                if item.tier != TIER_RESERVATION and policy.order == "multifactor":
                    reasons[job.id] = Reason.RESERVATION
                    continue
                if now < reservation.start:
                    reasons[job.id] = Reason.RESERVATION
                    continue

            if strict_blocked:
                reasons[job.id] = Reason.PRIORITY
                continue
            exempt = job.emergency or reservation is not None
            if not exempt:
                limit_reason = self.running_limit(job, k)
                if limit_reason is not None:
                    reasons[job.id] = limit_reason
                    continue

            limit = job.time_limit_s
            drain = not exempt and limit > self.drain_long
            if restrict is not None:
                units = self.place_in(restrict, classes, k, limit, owner)
                fail = Reason.RESOURCES
            else:
                units, fail = self._place_cached(classes, k, limit, drain)
            if units is not None:
                pred = job.predicted_runtime_s
                runtime = min(pred, limit) if pred is not None else limit
                self.take(units, now + limit, now + runtime, job.id)
                self.count(job.user, job.queue, job.category, k)
                started[job.id] = units
                starts.append(Start(job.id, tuple(self.unit_ids[u] for u in units)))
                continue

            cause = self.preemption_cause(job, restrict)
            if cause is not None:
                found = self.preempt_for(job, classes, k, restrict, owner, cause)
                if found is not None:
                    units, victims = found
                    for victim in victims:
                        self.victims.add(victim)
                        preemptions.append(Preemption(victim, cause, job.id))
                    ready = now + policy.preemption_grace_s
                    self.take(units, ready + limit, ready + limit, job.id)
                    self.count(job.user, job.queue, job.category, k)
                    preempting[job.id] = units
                    reasons[job.id] = Reason.PREEMPTING
                    continue

            reasons[job.id] = fail
            if drain:
                hint = self.drain_hint(classes, k)
                if hint is not None:
                    drain_held[job.id] = hint
            if not policy.backfill:
                strict_blocked = True
            if guarantees_left > 0 and restrict is None:
                nodes = self.candidate_nodes(classes)
                if drain:
                    nodes = [(n, c) for n, c in nodes if self.keeps_drain_reserve(n, k)]
                found_start = self.earliest(nodes, k, limit, owner)
                if found_start is not None:
                    t, units = found_start
                    guarantees[job.id] = Guarantee(t, tuple(self.unit_ids[u] for u in units))
                    for u in units:
                        for v in (u, *self.conflicts[u]):
                            self.add_block(v, (t, t + limit, GUARANTEE))
                    if drain:
                        # Its node counts as pinned already, so that jobs backfilled
                        # behind it cannot use up the reserve it needs at its start.
                        self.pin(self.unit_node[units[0]])
                    guarantees_left -= 1
                    if not (job.emergency or reservation is not None):
                        keys = limit_keys(policy, job.user, job.queue, job.category)
                        self.promised.append((t, {key for key, *_ in keys}, k))
                    # Later successes may no longer hold: new blocks invalidate cached fits
                    # only in the direction of failing more, so the failure cache stays valid.

        estimated: dict[int, float | None] = {}
        if estimates:
            estimated = _Forecast(self, ranked, started, preempting, never, drain_held).run()
        pending: dict[int, PendingInfo] = {}
        # Credit orders a tier only under the multifactor order (scheduler/priority.py).
        broke = self.state.users_without_credit if policy.order == "multifactor" else frozenset()
        credited_waiting_tiers: set[int] = set()  # tiers where a user with credit waits
        for position, item in enumerate(ranked, 1):
            job_id = item.job.id
            if job_id in started:
                continue
            reason = reasons.get(job_id, Reason.RESOURCES)
            if item.job.user not in broke:
                if reason in CREDIT_ORDERED:
                    credited_waiting_tiers.add(item.tier)
            elif reason in CREDIT_ORDERED and item.tier in credited_waiting_tiers:
                reason = Reason.NO_CREDIT
            pending[job_id] = PendingInfo(
                position,
                self.not_before_slot(item.job, estimated.get(job_id)),
                reason,
                item.priority,
            )
        return Plan(
            starts=starts,
            preemptions=preemptions,
            pending=pending,
            guarantees=guarantees,
            priorities={item.job.id: item.priority for item in ranked},
        )

    def not_before_slot(self, job: PendingJob, estimate: float | None) -> float | None:
        """A booking's job cannot start before its slot does, whatever GPUs free up."""
        if estimate is None or job.reservation_id is None:
            return estimate
        reservation = self.reservations.get(job.reservation_id)
        return estimate if reservation is None else max(estimate, reservation.start)

    def _place_cached(
        self, classes: tuple[int, ...], k: int, limit: float, drain: bool = False
    ) -> tuple[list[int] | None, Reason]:
        """place_now, remembering failures: within a pass free units only disappear and
        blocks only appear and draining nodes only get pinned, so a request that failed
        fails again."""
        no_free = self._no_free.get(classes)
        if no_free is not None and k >= no_free:
            return None, Reason.RESOURCES
        key = (classes, k, limit, drain)
        cached = self._fail_cache.get(key)
        if cached is not None:
            return None, cached
        units = self.place_now(classes, k, limit, -2, drain=drain)
        if units is not None:
            return units, Reason.RESOURCES
        if drain and self.place_now(classes, k, limit, -2) is not None:
            # Free, but only on wide nodes the drain reserve keeps for wide jobs.
            reason = Reason.RESOURCES
        elif self.place_now(classes, k, INF, -2, kinds=0) is None:
            reason = Reason.RESOURCES
            self._no_free[classes] = min(k, self._no_free.get(classes, k))
        elif self.place_now(classes, k, limit, -2, kinds=1) is None:
            reason = Reason.RESERVATION
        else:
            reason = Reason.PRIORITY
        self._fail_cache[key] = reason
        return None, reason

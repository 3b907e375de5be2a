"""The start estimates of a planning pass: the second half of ``engine.plan``.

Once the pass has made its decisions, every job that stays pending is played forward in
order onto the earliest GPUs that free up, judged by predicted run times (``_Forecast``).
The forecast reads the pass's state (``PassState``, what ``engine._Pass`` offers) and
changes nothing of it; the bookings it makes are its own.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Iterable
from typing import Protocol

from scheduler.model import ClusterState, PendingJob, Policy, Reason, Reservation
from scheduler.priority import RankedJob

INF = math.inf
# Block owner of a backfill guarantee: applies to every job, unlike a reservation.
GUARANTEE = -1

# (start, end, owner) on one unit; the owner is a reservation's id or GUARANTEE. The
# pass makes the blocks; the forecast skips guarantees and its own reservation's.
Block = tuple[float, float, int]
# A concurrency limit a job counts against (see ``engine.limit_keys``).
LimitKey = tuple[str, ...]


class PassState(Protocol):
    """What the forecast reads of the decision pass (``engine._Pass``), index-addressed."""

    state: ClusterState
    policy: Policy
    now: float
    reservations: dict[int, Reservation]
    unit_index: dict[str, int]
    unit_node: list[int]
    unit_class: list[int]
    node_usable: list[bool]
    # Per unit: when it frees up by the predicted ends of the jobs on it.
    avail_pred: list[float]
    # Per unit: reservation and guarantee blocks, sorted by start (None: no block).
    blocks: list[list[Block] | None]

    def _running_ends(
        self, start: float, limit: float, predicted: float | None
    ) -> tuple[float, float]: ...

    def units_needed(self, job: PendingJob) -> int: ...

    def matching_classes(self, job: PendingJob) -> tuple[int, ...]: ...

    def candidate_nodes(
        self, classes: tuple[int, ...], restrict: Iterable[int] | None = None
    ) -> list[tuple[int, list[int]]]: ...

    def limits_of(
        self, user: str, queue: str, category: str
    ) -> list[tuple[LimitKey, int, bool, Reason]]: ...


class _Forecast:
    """Plays the pending jobs forward in order onto the earliest free units, using
    predicted run times. No holes are back-filled; even so, in replays estimates for jobs
    that start within the hour mostly err early (running jobs end later than predicted,
    see ``_Pass._running_ends``), and far ones early too (later arrivals go ahead)."""

    def __init__(
        self,
        p: PassState,
        ranked: list[RankedJob],
        started: dict[int, list[int]],
        preempting: dict[int, list[int]],
        never: set[int],
        drain_held: dict[int, float] | None = None,
    ) -> None:
        self.p = p
        self.drain_held = drain_held or {}
        self.ranked = ranked
        self.started = started
        self.preempting = preempting
        self.never = never
        # Sorted (free time, unit) per unit class, over usable nodes only.
        self.pools: dict[int, list[tuple[float, int]]] = {}
        self.free_at = list(p.avail_pred)
        for u, node in enumerate(p.unit_node):
            if p.node_usable[node]:
                self.pools.setdefault(p.unit_class[u], []).append((self.free_at[u], u))
        for lst in self.pools.values():
            lst.sort()
        self.limiters: dict[tuple[str, ...], tuple[int, list[float]]] | None = None
        self.reserved_nodes: dict[tuple[int, tuple[int, ...]], list[tuple[int, list[int]]]] = {}
        self.limiter_keys: dict[tuple[str, str, str], list[tuple[LimitKey, int, bool]]] = {}
        self.node_heaps: dict[
            tuple[tuple[int, ...], int], tuple[list[tuple[float, int]], dict[int, list[int]]]
        ] = {}
        # Past its last booking a unit is unconstrained: skips walking its block list.
        self.last_block_end = [
            max((e for _s, e, _w in lst), default=-INF) if lst else -INF for lst in p.blocks
        ]

    # Limits are approximated by sorted end times of the jobs they count.
    def _limiter_keys(
        self, user: str, queue: str, category: str
    ) -> list[tuple[LimitKey, int, bool]]:
        owner = (user, queue, category)
        keys = self.limiter_keys.get(owner)
        if keys is None:
            keys = self.limiter_keys[owner] = [
                (key, cap, per_unit)
                for key, cap, per_unit, _ in self.p.limits_of(user, queue, category)
            ]
        return keys

    def _init_limiters(self) -> dict[tuple[str, ...], tuple[int, list[float]]]:
        limiters: dict[tuple[str, ...], tuple[int, list[float]]] = {}
        p = self.p
        for job in p.state.running:
            _, end = p._running_ends(job.start_time, job.time_limit_s, job.predicted_runtime_s)
            self._book_limits(limiters, job.user, job.queue, job.category, len(job.gpu_ids), end)
        return limiters

    def _book_limits(
        self,
        limiters: dict[tuple[str, ...], tuple[int, list[float]]],
        user: str,
        queue: str,
        category: str,
        k: int,
        end: float,
    ) -> None:
        for key, cap, per_unit in self._limiter_keys(user, queue, category):
            entry = limiters.get(key)
            if entry is None:
                entry = limiters[key] = (cap, [])
            for _ in range(k if per_unit else 1):
                bisect.insort(entry[1], end)

    def _limit_start(self, keys: list[tuple[LimitKey, int, bool]], k: int) -> float:
        assert self.limiters is not None
        t = self.p.now
        for key, cap, per_unit in keys:
            entry = self.limiters.get(key)
            if entry is None:
                continue
            ends = entry[1]
            need = k if per_unit else 1
            # At most cap - need of the counted jobs may still run when this one starts.
            excess = len(ends) - (cap - need)
            if excess > 0 and ends[excess - 1] > t:
                t = ends[excess - 1]
        return t

    def _valid_from(self, u: int, t: float, r: float, owner: int) -> float:
        """Earliest start >= t at which [start, start + r) on u avoids others' bookings."""
        lst = self.p.blocks[u]
        if lst is None or t >= self.last_block_end[u]:
            return t
        # Blocks are sorted by start: one sweep finds the first gap of length r. A block
        # ending by t is behind; one starting at or after t + r ends the search; any
        # other overlaps [t, t + r) and moves t to its end. (Guarantee blocks only bind
        # backfill decisions, not estimates.)
        end = t + r
        for s, e, who in lst:
            if e <= t or who in (GUARANTEE, owner):
                continue
            if s >= end:
                break
            t = e
            end = t + r
        return t

    def _book(self, u: int, end: float) -> None:
        pool = self.pools[self.p.unit_class[u]]
        old = self.free_at[u]
        i = bisect.bisect_left(pool, (old, u))
        if i < len(pool) and pool[i] == (old, u):
            pool.pop(i)
        self.free_at[u] = end
        bisect.insort(pool, (end, u))

    def _single(
        self, classes: tuple[int, ...], t_min: float, r: float, owner: int
    ) -> tuple[float, int] | None:
        best_t = INF
        best_u = -1
        blocks, last_block_end = self.p.blocks, self.last_block_end
        for c in classes:
            pool = self.pools.get(c)
            if not pool:
                continue
            i = bisect.bisect_right(pool, (t_min, INF)) - 1
            # Best fit: the unit that frees up last before t_min wastes least.
            j = i
            found = False
            while j >= 0 and i - j < 8:
                u = pool[j][1]
                if blocks[u] is None or t_min >= last_block_end[u]:
                    t = t_min  # no booking ahead (_valid_from's first test, inlined)
                else:
                    t = self._valid_from(u, t_min, r, owner)
                if t == t_min:
                    if t_min < best_t:
                        best_t, best_u = t_min, u
                    found = True
                    break
                if t < best_t:  # booked soon: usable after the booking ends
                    best_t, best_u = t, u
                j -= 1
            if found:
                continue
            # Units freeing after t_min, earliest first; most have a booking ahead, so
            # _valid_from's sweep is inlined here, and it gives up once the start it
            # finds is no better than the best so far (the start only grows).
            for free, u in itertools.islice(pool, i + 1, None):
                if free >= best_t:
                    break
                lst = blocks[u]
                if lst is None or free >= last_block_end[u]:
                    # No booking ahead of this unit: it is usable at once, and later
                    # units in the pool free up later.
                    best_t, best_u = free, u
                    break
                t = free
                end = t + r
                for bs, be, who in lst:
                    if be <= t or who in (GUARANTEE, owner):
                        continue
                    if bs >= end or t >= best_t:
                        break
                    t = be
                    end = t + r
                if t < best_t:
                    best_t, best_u = t, u
        if best_u < 0:
            return None
        return best_t, best_u

    def _node_start(
        self, cand: list[int], k: int, t_min: float, r: float, owner: int, best_t: float
    ) -> tuple[float, list[int]] | None:
        """Earliest start before ``best_t`` of k of these units (one node) together."""
        free_at = self.free_at
        frees = sorted([(free_at[u] if free_at[u] > t_min else t_min, u) for u in cand])
        kth = frees[k - 1][0]
        if kth >= best_t:
            return None
        blocks = self.p.blocks
        if all(blocks[u] is None for _f, u in frees):
            return kth, [u for _f, u in frees[:k]]
        times = sorted(
            {f for f, _ in frees[k - 1 :]}
            | {e for u in cand for (_s, e, _w) in (blocks[u] or ()) if e > kth}
        )
        for t in times:
            if t >= best_t:
                break
            ok = [u for f, u in frees if f <= t and self._valid_from(u, t, r, owner) == t]
            if len(ok) >= k:
                return t, ok[:k]
        return None

    def _multi(
        self, nodes: list[tuple[int, list[int]]], k: int, t_min: float, r: float, owner: int
    ) -> tuple[float, list[int]] | None:
        best_t = INF
        best_units: list[int] | None = None
        for _node, cand in nodes:
            if len(cand) < k:
                continue
            found = self._node_start(cand, k, t_min, r, owner, best_t)
            if found is not None:
                best_t, best_units = found
        if best_units is None:
            return None
        return best_t, best_units

    def _kth_free(self, cand: list[int], k: int) -> float:
        free_at = self.free_at
        return sorted([free_at[u] for u in cand])[k - 1]

    def _multi_indexed(
        self, key: tuple[tuple[int, ...], int], t_min: float, r: float, owner: int
    ) -> tuple[float, list[int]] | None:
        """Like ``_multi`` over all usable nodes, visiting nodes by their k-th free time
        through a lazy heap: free times only grow during the forecast, so a stale heap
        key is too small, never too large, and is refreshed when it surfaces."""
        classes, k = key
        entry = self.node_heaps.get(key)
        if entry is None:
            nodes = {n: u for n, u in self.p.candidate_nodes(classes) if len(u) >= k}
            heap = [(self._kth_free(u, k), n) for n, u in nodes.items()]
            heapq.heapify(heap)
            entry = self.node_heaps[key] = (heap, nodes)
        heap, nodes = entry
        best_t = INF
        best_units: list[int] | None = None
        seen: list[tuple[float, int]] = []
        while heap:
            stale, node = heap[0]
            if max(stale, t_min) >= best_t:
                break
            heapq.heappop(heap)
            fresh = self._kth_free(nodes[node], k)
            if fresh != stale:
                heapq.heappush(heap, (fresh, node))
                continue
            seen.append((fresh, node))
            found = self._node_start(nodes[node], k, t_min, r, owner, best_t)
            if found is not None:
                best_t, best_units = found
        for item in seen:
            heapq.heappush(heap, item)
        if best_units is None:
            return None
        return best_t, best_units

    def run(self) -> dict[int, float | None]:
        p = self.p
        now = p.now
        self.limiters = self._init_limiters()
        started = self.started
        units_needed = p.units_needed
        book_limits, limiters = self._book_limits, self.limiters
        # Expected ends (by predicted run times) of the jobs others may depend on.
        ends: dict[int, float] = {}
        for run in p.state.running:
            ends[run.id] = p._running_ends(
                run.start_time, run.time_limit_s, run.predicted_runtime_s
            )[1]
        for item in self.ranked:
            job = item.job
            if job.id in started:
                r = self._runtime(job)
                ends[job.id] = now + r
                book_limits(limiters, job.user, job.queue, job.category, units_needed(job), now + r)
        estimates: dict[int, float | None] = {}
        # Jobs whose dependencies are pending jobs not yet played forward wait their turn.
        deferred: list[PendingJob] = []
        pending_ids = {item.job.id for item in self.ranked}
        for item in self.ranked:
            job = item.job
            if job.id in started:
                continue
            if job.depends_on:
                deferred.append(job)
                continue
            estimates[job.id] = self._place(job, now, ends)
        while deferred:
            waiting: list[PendingJob] = []
            for job in deferred:
                t_min: float | None = now
                later = False
                for dep in job.depends_on:
                    end = ends.get(dep)
                    if end is not None:
                        t_min = max(t_min, end) if t_min is not None else end
                    elif dep not in pending_ids or dep in estimates:
                        t_min = None  # unknown here, or never starts as things are
                        break
                    else:
                        later = True  # not played forward yet
                if t_min is not None and later:
                    waiting.append(job)
                    continue
                estimates[job.id] = None if t_min is None else self._place(job, t_min, ends)
            if len(waiting) == len(deferred):  # a circle: none of them can be placed
                for job in waiting:
                    estimates[job.id] = None
                break
            deferred = waiting
        return estimates

    @staticmethod
    def _runtime(job: PendingJob) -> float:
        pred = job.predicted_runtime_s
        limit = job.time_limit_s
        return pred if pred is not None and pred < limit else limit

    def _place(self, job: PendingJob, t_min: float, ends: dict[int, float]) -> float | None:
        """Play one job forward from ``t_min``: its estimated start, its units booked and
        its expected end noted in ``ends``; None if it cannot start as things are."""
        p = self.p
        now = p.now
        job_id = job.id
        if job_id in self.never:
            return None
        book = self._book
        k = p.units_needed(job)
        r = self._runtime(job)
        if r < 1.0:
            r = 1.0
        if job_id in self.preempting:
            t = now + p.policy.preemption_grace_s
            for u in self.preempting[job_id]:
                book(u, t + r)
            ends[job_id] = t + r
            return t
        classes = p.matching_classes(job)
        owner = -2
        if job.reservation_id is not None:
            res = p.reservations[job.reservation_id]
            owner = res.id
            t_min = max(t_min, res.start)
            nodes = self.reserved_nodes.get((res.id, classes))
            if nodes is None:
                restrict = [p.unit_index[g] for g in res.gpu_ids if g in p.unit_index]
                nodes = self.reserved_nodes[(res.id, classes)] = p.candidate_nodes(
                    classes, restrict
                )
            found = self._multi(nodes, k, t_min, r, owner)
        else:
            if not job.emergency:
                keys = self._limiter_keys(job.user, job.queue, job.category)
                if keys:
                    t = self._limit_start(keys, k)
                    if t > t_min:
                        t_min = t
            held = self.drain_held.get(job_id)
            if held is not None and held > t_min:
                t_min = held
            if k == 1:
                single = self._single(classes, t_min, r, owner)
                found = (single[0], [single[1]]) if single is not None else None
            else:
                found = self._multi_indexed((classes, k), t_min, r, owner)
        if found is None:
            return None
        t, units = found
        for u in units:
            book(u, t + r)
        if not job.emergency and job.reservation_id is None:
            assert self.limiters is not None
            self._book_limits(self.limiters, job.user, job.queue, job.category, k, t + r)
        ends[job_id] = t + r
        return t

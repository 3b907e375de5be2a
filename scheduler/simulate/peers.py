"""Peer policies, each implemented from its source and replayed on the same workloads as
LabPortal's engine (docs/scheduler.md, "Peer policies"):

* ``slurm-multifactor``: Slurm's priority/multifactor with sched/backfill, age and fair
  share only (Fair Tree, Slurm's default fair-share algorithm since 19.05), with the
  backfill defaults of ``slurm.conf``.
* ``tiresias`` and ``tiresias-nopreempt``: Tiresias's discretised two-dimensional
  least-attained-service (Gu et al., NSDI 2019), with the queue threshold of the
  authors' simulator; with its preemption, and a variant that only starts jobs on free
  GPUs.
* ``themis``: Themis-style finish-time fairness (Mahajan et al., NSDI 2020): GPUs are
  leased, and when a lease ends or GPUs come free they go to the jobs whose
  finish-time fairness ratio is worst.

The rules (priorities, queues, ratios) are plain functions a unit test can call; the
replay (``run_peer``) shares the event loop, the cluster and the accounting with the
other policies of ``scheduler.simulate``. Placement is on one node, as for every policy
here. A preempted job resumes where it stopped (the papers assume checkpoints) and has
no restart cost.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scheduler.model import Gpu, GpuKind
from scheduler.simulate.workload import SimJob, _unit_gpus

if TYPE_CHECKING:
    from scheduler.simulate.run import Simulation

PEERS = ("slurm-multifactor", "tiresias", "tiresias-nopreempt", "themis")

# --- Slurm (https://slurm.schedmd.com/priority_multifactor.html, fair_tree.html,
# slurm.conf.html). Job_priority = PriorityWeightAge * age_factor +
# PriorityWeightFairshare * fair-share_factor, every other factor's weight 0. Slurm ships
# every weight at 0; we give the two factors equal weight.
SLURM_WEIGHT_AGE = 1000.0
SLURM_WEIGHT_FAIRSHARE = 1000.0
SLURM_MAX_AGE_S = 7 * 86_400.0  # PriorityMaxAge default 7-0
SLURM_DECAY_HALF_LIFE_S = 7 * 86_400.0  # PriorityDecayHalfLife default 7-0
SLURM_BF_WINDOW_S = 1440 * 60.0  # bf_window default: 1440 minutes
SLURM_BF_MAX_JOB_TEST = 500  # bf_max_job_test default

# --- Tiresias: 2D-LAS on attained service = GPUs x executed seconds. The authors'
# simulator (SymbioticLab/Tiresias, dlas-gpu) runs two queues split at 3,250 GPU-seconds;
# new jobs enter the first queue; within a queue, jobs run first come first served.
TIRESIAS_QUEUE_LIMITS_GPU_S: tuple[float, ...] = (3250.0,)
# STARVELIMIT (the paper's PROMOTEKNOB): a job in a lower queue that has waited this many
# times its executed time since it last ran goes back to the first queue. 0 turns it off,
# as the authors' dlas-gpu runs do.
TIRESIAS_PROMOTE_KNOB = 0.0

# --- Themis: the lease length (minutes in the paper; ours is 10 minutes).
THEMIS_LEASE_S = 600.0


def slurm_age_factor(age_s: float, max_age_s: float = SLURM_MAX_AGE_S) -> float:
    """Slurm's age factor: time pending over PriorityMaxAge, capped at 1.0."""
    return min(1.0, max(0.0, age_s) / max_age_s)


def slurm_fair_tree_factors(
    shares: Mapping[str, float], usage: Mapping[str, float]
) -> dict[str, float]:
    """Fair Tree on one account holding every user: Level FS = S / U (S: the user's share
    of the siblings' shares, U: their share of the siblings' usage; infinite without
    usage). Users are ranked by Level FS, ties sharing a rank, and the fair-share factor is
    rank / users, so the user furthest under their share gets 1.0."""
    total_shares = sum(shares.values())
    total_usage = sum(max(0.0, usage.get(u, 0.0)) for u in shares)

    def level_fs(user: str) -> float:
        used = max(0.0, usage.get(user, 0.0))
        if used <= 0 or total_usage <= 0:
            return math.inf
        return (shares[user] / total_shares) / (used / total_usage)

    levels = {u: level_fs(u) for u in shares}
    ordered = sorted(levels.values())  # ascending: the most over-served first
    n = len(ordered)
    factors: dict[str, float] = {}
    for user, value in levels.items():
        # Rank from the bottom; tied users share the highest rank of their group.
        rank = _count_at_most(ordered, value)
        factors[user] = rank / n
    return factors


def _count_at_most(ordered: Sequence[float], value: float) -> int:
    lo, hi = 0, len(ordered)
    while lo < hi:
        mid = (lo + hi) // 2
        if ordered[mid] <= value:
            lo = mid + 1
        else:
            hi = mid
    return lo


def slurm_priority(age_s: float, fairshare_factor: float) -> float:
    """Slurm's multifactor priority with only the age and fair-share weights set."""
    return SLURM_WEIGHT_AGE * slurm_age_factor(age_s) + SLURM_WEIGHT_FAIRSHARE * fairshare_factor


def tiresias_queue(
    attained_gpu_s: float, limits: Sequence[float] = TIRESIAS_QUEUE_LIMITS_GPU_S
) -> int:
    """The 2D-LAS queue of a job that has attained ``attained_gpu_s`` GPU-seconds."""
    for q, limit in enumerate(limits):
        if attained_gpu_s < limit:
            return q
    return len(limits)


def themis_rho(
    *,
    now: float,
    submit: float,
    executed_s: float,
    estimate_s: float,
    gpus: float,
    capacity: float,
    contenders: int,
) -> float:
    """Finish-time fairness: the finish time the job is heading for in the shared cluster
    (time so far plus the estimated remainder) over its run time alone on 1/N of it
    (a job wider than C/N runs proportionally slower there)."""
    shared = (now - submit) + max(0.0, estimate_s - executed_s)
    ideal = estimate_s * max(1.0, gpus * max(1, contenders) / capacity)
    return shared / ideal if ideal > 0 else math.inf


@dataclass(slots=True)
class _Active:
    """A job the peer replay has seen and not finished."""

    job: SimJob
    arrival: int  # arrival order: the tie-break everywhere
    executed: float = 0.0  # seconds run so far (all segments)
    since: float | None = None  # start of the current segment; None while pending
    units: tuple[str, ...] = ()
    segments: list[tuple[float, float]] = field(default_factory=list)
    # Tiresias: the queue, the order of entry into it, and the executed time the queue
    # is judged by (zeroed by a promotion); pending time since the job last ran.
    queue: int = 0
    queue_seq: int = 0
    queue_executed: float = 0.0
    pending_since: float = 0.0
    lease_end: float = 0.0
    preemptions: int = 0
    epoch: int = 0  # bumps on every start, so stale finish events are skipped

    @property
    def running(self) -> bool:
        return self.since is not None


class _Units:
    """Which GPU units (whole GPUs or shared slots) each node has, and who holds them."""

    def __init__(self, units: Sequence[Gpu]) -> None:
        self.by_node: dict[str, dict[bool, list[str]]] = {}
        for unit in units:
            if unit.kind == GpuKind.MIG:
                continue
            kinds = self.by_node.setdefault(unit.node, {True: [], False: []})
            kinds[unit.kind == GpuKind.SLOT].append(unit.id)
        self.node_of = {u.id: u.node for u in units}
        self.holder: dict[str, int] = {}  # unit id -> job index

    def free(self, node: str, slot: bool) -> list[str]:
        return [u for u in self.by_node[node][slot] if u not in self.holder]


def _need(job: SimJob) -> int:
    return 1 if job.shared_slot else job.gpus


class PeerReplay:
    """One workload replayed under one peer policy, writing starts, ends and segments
    into the simulation's jobs and its allocation integrals."""

    def __init__(self, sim: Simulation) -> None:
        if sim.policy_name not in PEERS:
            raise ValueError(f"{sim.policy_name!r} is not a peer policy; choose from {PEERS}")
        self.sim = sim
        self.name = sim.policy_name
        self.units = _Units(sim.units)
        self.nodes = sorted(self.units.by_node)
        self.capacity = sum(
            len(k[False]) + len(k[True]) / sim.slots_per_gpu for k in self.units.by_node.values()
        )
        self.active: dict[int, _Active] = {}
        self.finishes: list[tuple[float, int, int]] = []
        self.busy = 0.0
        self.seq = 0
        # Slurm's decayed usage per user (charged as jobs end, running jobs added live).
        self.usage: dict[str, float] = {}
        self.usage_ref = 0.0
        self.preemptions = 0

    # ------------------------------------------------------------------ loop
    def run(self) -> None:
        jobs = self.sim.jobs
        next_arrival = 0
        t_prev = jobs[0].submit if jobs else 0.0
        tick = math.inf
        while next_arrival < len(jobs) or self.active:
            t = min(
                jobs[next_arrival].submit if next_arrival < len(jobs) else math.inf,
                self.finishes[0][0] if self.finishes else math.inf,
                tick,
            )
            if math.isinf(t):
                break  # jobs left that fit no node (refused at load, so never)
            pending = any(not a.running for a in self.active.values())
            self.sim._account(t_prev, t, self.busy, pending)
            self._advance(t_prev, t)
            t_prev = t
            while self.finishes and self.finishes[0][0] <= t:
                _, idx, epoch = heapq.heappop(self.finishes)
                active = self.active.get(idx)
                if active is None or active.epoch != epoch or not active.running:
                    continue  # preempted since this finish was planned
                self._stop(active, t)
                del self.active[idx]
                active.job.end = t
                active.job.runs = tuple(active.segments)
                self._charge(active.job, t)
                self.sim._finish(active.job)
            while next_arrival < len(jobs) and jobs[next_arrival].submit <= t:
                job = jobs[next_arrival]
                self.sim._arrive(job)
                self.active[job.index] = _Active(
                    job, next_arrival, queue_seq=self._next_seq(), pending_since=job.submit
                )
                next_arrival += 1
            if any(not a.running for a in self.active.values()):
                self._decide(t)
            tick = self._next_tick(t)
        self.sim.preemptions = self.preemptions

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def _advance(self, t_prev: float, t: float) -> None:
        """Executed time for running jobs; Tiresias demotes a job past its threshold."""
        if t <= t_prev:
            return
        for a in self.active.values():
            if a.running:
                a.executed += t - t_prev
                a.queue_executed += t - t_prev
        if self.name.startswith("tiresias"):
            for a in self.active.values():
                queue = tiresias_queue(a.queue_executed * _need(a.job))
                if a.running and queue > a.queue:
                    a.queue, a.queue_seq = queue, self._next_seq()

    def _next_tick(self, t: float) -> float:
        """The next time a decision can change without an arrival or an end: a Tiresias
        demotion or promotion, or the end of a Themis lease while jobs wait."""
        tick = math.inf
        if self.name.startswith("tiresias"):
            for a in self.active.values():
                g = _need(a.job)
                if a.running and a.queue < len(TIRESIAS_QUEUE_LIMITS_GPU_S):
                    left = TIRESIAS_QUEUE_LIMITS_GPU_S[a.queue] / g - a.queue_executed
                    tick = min(tick, t + max(left, 1e-3))
                elif not a.running and TIRESIAS_PROMOTE_KNOB > 0 and a.queue > 0:
                    due = a.pending_since + TIRESIAS_PROMOTE_KNOB * a.queue_executed
                    tick = min(tick, max(due, t + 1e-3))
        elif self.name == "themis" and any(not a.running for a in self.active.values()):
            leases = [a.lease_end for a in self.active.values() if a.running]
            if leases:
                tick = max(t + 1e-3, min(leases))
        return tick

    # ------------------------------------------------------------------ decisions
    def _decide(self, t: float) -> None:
        if self.name == "slurm-multifactor":
            self._slurm_pass(t)
            return
        if self.name.startswith("tiresias"):
            self._promote(t)
            order = sorted(
                self.active.values(),
                key=lambda a: (a.queue, 0 if a.running else 1, a.queue_seq, a.arrival),
            )
            self._allocate(t, order, preempt=self.name == "tiresias", pinned=())
            return
        # Themis: jobs whose lease runs keep their GPUs; the rest compete by ratio.
        contenders = len({a.job.user for a in self.active.values()})
        pinned = [a for a in self.active.values() if a.running and a.lease_end > t]
        rest = [a for a in self.active.values() if not (a.running and a.lease_end > t)]
        rest.sort(key=lambda a: (-self._rho(a, t, contenders), a.arrival))
        self._allocate(t, pinned + rest, preempt=True, pinned=pinned)
        for a in self.active.values():
            if a.running and a.lease_end <= t:
                a.lease_end = t + THEMIS_LEASE_S  # kept at the auction: a new lease

    def _rho(self, a: _Active, t: float, contenders: int) -> float:
        return themis_rho(
            now=t,
            submit=a.job.submit,
            executed_s=a.executed,
            estimate_s=max(a.job.predicted, 1.0),
            gpus=_unit_gpus(a.job, self.sim.slots_per_gpu),
            capacity=self.capacity,
            contenders=contenders,
        )

    def _promote(self, t: float) -> None:
        if TIRESIAS_PROMOTE_KNOB <= 0:
            return
        for a in self.active.values():
            if (
                not a.running
                and a.queue > 0
                and a.queue_executed > 0
                and t - a.pending_since >= TIRESIAS_PROMOTE_KNOB * a.queue_executed
            ):
                a.queue, a.queue_seq, a.queue_executed = 0, self._next_seq(), 0.0

    def _allocate(
        self, t: float, order: Sequence[_Active], *, preempt: bool, pinned: Iterable[_Active]
    ) -> None:
        """Walk ``order``: a running job keeps its GPUs unless a job before it claimed
        one; a waiting job takes a node with room among the GPUs nobody before it
        claimed, preferring free GPUs and then the fewest running jobs to stop (only with
        ``preempt``). Jobs that fit nowhere are passed over (work-conserving)."""
        claimed: set[str] = set()
        stop: dict[int, _Active] = {}
        starts: list[tuple[_Active, tuple[str, ...]]] = []
        keep = {a.job.index for a in pinned}
        for a in order:
            if a.running and a.job.index not in stop:
                if a.job.index in keep or not claimed.intersection(a.units):
                    claimed.update(a.units)
                    continue
                stop[a.job.index] = a
            chosen = self._place(a.job, claimed, stop, preempt, keep)
            if chosen is None:
                continue
            claimed.update(chosen)
            for unit in chosen:
                holder = self.units.holder.get(unit)
                if holder is not None and holder != a.job.index:
                    stop[holder] = self.active[holder]
            starts.append((a, chosen))
        for a in stop.values():
            self._stop(a, t)
            a.preemptions += 1
            self.preemptions += 1
        for a, chosen in starts:
            self._start(a, chosen, t)

    def _place(
        self,
        job: SimJob,
        claimed: set[str],
        stop: Mapping[int, _Active],
        preempt: bool,
        keep: set[int],
    ) -> tuple[str, ...] | None:
        need = _need(job)
        best: tuple[int, int, str] | None = None
        best_units: list[str] = []
        for node in self.nodes:
            free: list[str] = []
            taken: list[str] = []
            for unit in self.units.by_node[node][job.shared_slot]:
                if unit in claimed:
                    continue
                holder = self.units.holder.get(unit)
                if holder is None or holder == job.index or holder in stop:
                    free.append(unit)
                elif preempt and holder not in keep:
                    taken.append(unit)
            if len(free) + len(taken) < need:
                continue
            use = free[:need] + taken[: max(0, need - len(free))]
            victims = {self.units.holder[u] for u in use if u in taken}
            key = (len(victims), len(free) - min(need, len(free)), node)
            if best is None or key < best:
                best, best_units = key, use
        return tuple(best_units) if best is not None else None

    def _start(self, a: _Active, units: tuple[str, ...], t: float) -> None:
        job = a.job
        if job.start is None:
            job.start = t
        a.since, a.units = t, units
        a.epoch += 1
        a.lease_end = t + THEMIS_LEASE_S
        for unit in units:
            self.units.holder[unit] = job.index
        job.gpu_ids = units
        self.busy += _unit_gpus(job, self.sim.slots_per_gpu)
        heapq.heappush(self.finishes, (t + job.duration - a.executed, job.index, a.epoch))

    def _stop(self, a: _Active, t: float) -> None:
        assert a.since is not None
        if t > a.since:
            a.segments.append((a.since, t))
        for unit in a.units:
            self.units.holder.pop(unit, None)
        self.busy -= _unit_gpus(a.job, self.sim.slots_per_gpu)
        a.since, a.units = None, ()
        a.pending_since = t

    # ------------------------------------------------------------------ Slurm
    def _decay_to(self, t: float) -> None:
        if t > self.usage_ref and self.usage:
            f = 0.5 ** ((t - self.usage_ref) / SLURM_DECAY_HALF_LIFE_S)
            for user in self.usage:
                self.usage[user] *= f
        self.usage_ref = max(self.usage_ref, t)

    def _charge(self, job: SimJob, t: float) -> None:
        if self.name != "slurm-multifactor":
            return
        self._decay_to(t)
        g = _unit_gpus(job, self.sim.slots_per_gpu)
        self.usage[job.user] = self.usage.get(job.user, 0.0) + g * job.duration

    def _slurm_pass(self, t: float) -> None:
        """One backfill pass: jobs in priority order (at most bf_max_job_test), each
        started now if it fits around the reservations made for the jobs before it,
        otherwise given a reservation at its earliest start within bf_window. Running jobs
        are planned to end at their time limits, as Slurm plans them."""
        waiting = [a for a in self.active.values() if not a.running]
        room = {
            slot: max(len(self.units.free(node, slot)) for node in self.nodes)
            for slot in (False, True)
        }
        if not any(_need(a.job) <= room[a.job.shared_slot] for a in waiting):
            return  # nothing fits the free GPUs: the pass would start nothing
        self._decay_to(t)
        usage = dict(self.usage)
        for a in self.active.values():
            if a.running and a.since is not None:
                g = _unit_gpus(a.job, self.sim.slots_per_gpu)
                usage[a.job.user] = usage.get(a.job.user, 0.0) + g * (t - a.since)
        shares = self.sim.workload.entitlement
        factors = slurm_fair_tree_factors(shares, usage)
        waiting.sort(
            key=lambda a: (
                -slurm_priority(t - a.job.submit, factors.get(a.job.user, 0.0)),
                a.job.submit,
                a.arrival,
            )
        )
        # Per node and unit kind: (start, end, units) intervals, running jobs first.
        plans: dict[tuple[str, bool], list[tuple[float, float, int]]] = {}
        for a in self.active.values():
            if a.running and a.since is not None:
                node = self.units.node_of[a.units[0]]
                end = max(a.since + a.job.time_limit, t + 1.0)
                plans.setdefault((node, a.job.shared_slot), []).append((t, end, _need(a.job)))
        for a in waiting[:SLURM_BF_MAX_JOB_TEST]:
            job = a.job
            need = _need(job)
            best: tuple[float, str] | None = None
            for node in self.nodes:
                cap = len(self.units.by_node[node][job.shared_slot])
                if cap < need:
                    continue
                latest = t + SLURM_BF_WINDOW_S if best is None else best[0] - 1e-9
                start = earliest_start(
                    plans.get((node, job.shared_slot), []), cap, need, t, job.time_limit, latest
                )
                if start is not None:
                    best = (start, node)
            if best is None:
                continue  # nothing within the backfill window: no reservation
            start, node = best
            if start <= t:
                units = tuple(self.units.free(node, job.shared_slot)[:need])
                assert len(units) == need, "the plan and the free units disagree"
                self._start(a, units, t)
            plans.setdefault((node, job.shared_slot), []).append(
                (start, start + job.time_limit, need)
            )


def earliest_start(
    intervals: Sequence[tuple[float, float, int]],
    capacity: int,
    need: int,
    now: float,
    length: float,
    latest: float = math.inf,
) -> float | None:
    """The earliest time in [``now``, ``latest``] from which ``need`` of ``capacity``
    units stay free for ``length`` seconds, given busy ``(start, end, units)``
    intervals; None if there is none. Only a time at which units come free can be it."""
    deltas: dict[float, int] = {now: 0}
    for s, e, u in intervals:
        s = max(s, now)
        if e > s:
            deltas[s] = deltas.get(s, 0) + u
            deltas[e] = deltas.get(e, 0) - u
    times = sorted(deltas)
    used: list[int] = []
    level = 0
    for time in times:
        level += deltas[time]
        used.append(level)
    i = 0
    while i < len(times):
        start = times[i]
        if start > latest:
            return None
        j = i
        while j < len(times) and times[j] < start + length and used[j] + need <= capacity:
            j += 1
        if j == len(times) or times[j] >= start + length:
            return start
        i = j + 1  # every start up to the blocked step would overlap it
    return None

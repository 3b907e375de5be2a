"""The replay: a workload played event by event through the engine (``Simulation``),
under LabPortal's policy or a baseline, on a built-in cluster or the lab's own."""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from scheduler.engine import plan
from scheduler.model import (
    ClusterState,
    Gpu,
    GpuKind,
    Node,
    PendingJob,
    Plan,
    Policy,
    QueuePolicy,
    Reason,
    RunningJob,
)
from scheduler.predict import RuntimePredictor
from scheduler.priority import Ranker
from scheduler.simulate.backlog import (
    ClassKey,
    Shape,
    _Backlog,
    _class,
    _FreeUnits,
    _owner,
    _shape,
    _witnesses,
)
from scheduler.simulate.metrics import summarize
from scheduler.simulate.peers import PEERS, PeerReplay
from scheduler.simulate.workload import SimJob, Workload, _unit_gpus, load_workload

POLICIES = ("labportal", "fifo", "timeslots", "sjf-oracle", *PEERS)


# A wake-up in the event heap: no job ends, a pass runs (after a preemption's grace).
WAKE = -1


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
STRICT_BLOCKING = frozenset(
    {Reason.RESOURCES, Reason.PRIORITY, Reason.RESERVATION, Reason.NO_CREDIT}
)


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
        self.slot_gpus = slot_gpus
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
        if not incremental and (
            self.policy.preempt_starving_after_s is not None
            or self.policy.preempt_share_after_s is not None
        ):
            raise ValueError("the full-pass replay applies no preemptions: use incremental=True")
        self.oracle = oracle
        self.predictor = RuntimePredictor()
        self.runtime_errors: list[float] = []
        self.busy_integral = 0.0
        self.waiting_time = 0.0
        self.incremental = incremental
        # Jobs whose start estimate the deep-backlog sampling skipped (see _EtaBudget).
        self.eta_skipped: set[int] = set()
        self.passes = 0
        # Jobs stopped and requeued (peer policies that preempt), and the most times one
        # job was (the LabPortal replay's; the cost of churn falls on that job).
        self.preemptions = 0
        self.most_preempted = 0
        # Jobs a pass picked from behind the head (classes that could still start).
        self.picked = 0
        # Called as (jobs arrived so far, pending now) after each arrival (the speed bench).
        self.on_arrival: Callable[[int, int], None] | None = None

    # ------------------------------------------------------------------ loop
    def run(self) -> dict[str, Any]:
        began = time.perf_counter()
        if self.policy_name == "timeslots":
            self._run_timeslots()
        elif self.policy_name in PEERS:
            PeerReplay(self).run()
        elif self.incremental:
            self._run_engine_incremental()
        else:
            self._run_engine()
        metrics = summarize(
            self.jobs,
            self.workload,
            policy_name=self.policy_name,
            gpus=self.gpus,
            slots_per_gpu=self.slots_per_gpu,
            busy_integral=self.busy_integral,
            waiting_time=self.waiting_time,
            eta_skipped=len(self.eta_skipped),
            runtime_errors=self.runtime_errors,
        )
        metrics["preemptions"] = self.preemptions
        metrics["most_preempted"] = self.most_preempted
        metrics["slot_gpus"] = sum(1 for unit in self.units if unit.kind is GpuKind.SLOT) // max(
            1, self.slots_per_gpu
        )
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
    def _running_job(
        job: SimJob, gpu_ids: tuple[str, ...], t: float, preemptions: int = 0
    ) -> RunningJob:
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
            preemptions=preemptions,
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
        # (time, job index); index WAKE: the pass after a preemption's grace. A job's entry
        # is current while ``ends`` holds its time (a preempted job's entry is stale).
        finishes: list[tuple[float, int]] = []
        ends: dict[int, float] = {}
        # Preempted jobs: the stretches they ran, and the work left (they resume where they
        # stopped, as the checkpoint-on-SIGTERM example in docs/jobs.md does).
        stretches: dict[int, list[tuple[float, float]]] = {}
        left: dict[int, float] = {}
        times_preempted: Counter[int] = Counter()
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
                end, idx = heapq.heappop(finishes)
                if idx == WAKE or ends.get(idx) != end:
                    continue  # a wake-up, or the end of a run that was preempted
                del ends[idx]
                job = jobs[idx]
                ran = running.pop(idx)
                free.release(ran.gpu_ids)
                busy -= _unit_gpus(job, self.slots_per_gpu)
                usage.advance(t)
                usage.charge(job.user, (t - ran.start_time) * _unit_gpus(job, self.slots_per_gpu))
                if idx in stretches:
                    job.runs = (*stretches.pop(idx), (ran.start_time, t))
                    job.end = t
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
                end = t + left.pop(job.index, job.duration)
                if job.start is None:
                    job.start = t
                    job.end = end
                job.gpu_ids = start.gpu_ids
                backlog.remove(job.index)
                owed.discard(job.index)
                free.take(start.gpu_ids)
                running[job.index] = self._running_job(
                    job, start.gpu_ids, t, times_preempted[job.index]
                )
                busy += _unit_gpus(job, self.slots_per_gpu)
                ends[job.index] = end
                heapq.heappush(finishes, (end, job.index))
            for preemption in result.preemptions:
                idx = preemption.job_id
                stopped = running.pop(idx, None)
                if stopped is None:
                    continue
                job = jobs[idx]
                left[idx] = ends.pop(idx) - t
                stretches.setdefault(idx, []).append((stopped.start_time, t))
                free.release(stopped.gpu_ids)
                busy -= _unit_gpus(job, self.slots_per_gpu)
                usage.advance(t)
                usage.charge(
                    job.user, (t - stopped.start_time) * _unit_gpus(job, self.slots_per_gpu)
                )
                backlog.add(self._pending_job(job))
                self.preemptions += 1
                times_preempted[idx] += 1
                self.most_preempted = max(self.most_preempted, times_preempted[idx])
            if result.preemptions:
                # The job that preempted starts once the victims' grace has passed.
                heapq.heappush(finishes, (t + self.policy.preemption_grace_s, WAKE))
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


def _usage_with_running(
    usage: Mapping[str, float], running: Iterable[RunningJob], t: float
) -> dict[str, float]:
    """Each user's decayed usage plus what their running jobs have held up to `t`."""
    current = dict(usage)
    for r in running:
        current[r.user] = current.get(r.user, 0.0) + (t - r.start_time) * len(r.gpu_ids)
    return current


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
    slot_gpus: int | None = None,
    slots_per_gpu: int = 4,
    timeslot_s: float = 4 * 3600.0,
    preempt_starving_after_s: float | None = None,
    preempt_share_after_s: float | None = None,
    preempt_max_times: int | None = None,
) -> dict[str, Any]:
    """Replay ``trace`` under ``policy`` and return the metrics (the ``--json`` object).

    ``preempt_*``: LabPortal's preemption for a starving job and for a member's share
    (``scheduler.model.Policy``; off unless given, the portal turns both on), and the
    cap on how often one job may be stopped for them (None: no cap).

    ``slot_gpus`` None exposes one GPU as shared slots only when the workload has jobs
    that use slots: a slot GPU no job can use would count as idle capacity in the
    allocation and keep its node's widest jobs from ever starting."""
    workload = load_workload(
        trace,
        users=users,
        seed=seed,
        load=load,
        window=window,
        max_jobs=max_jobs,
        max_gpus_per_job=gpus_per_node,
    )
    if slot_gpus is None:
        slot_gpus = 1 if any(job.shared_slot for job in workload.jobs) else 0
    engine_policy = None
    if policy == "labportal" and (
        preempt_starving_after_s is not None or preempt_share_after_s is not None
    ):
        engine_policy = replace(
            labportal_policy(),
            preempt_starving_after_s=preempt_starving_after_s,
            preempt_share_after_s=preempt_share_after_s,
            preempt_max_times=preempt_max_times,
        )
    return Simulation(
        workload,
        policy,
        gpus=gpus,
        per_node=gpus_per_node,
        slot_gpus=slot_gpus,
        slots_per_gpu=slots_per_gpu,
        timeslot_s=timeslot_s,
        policy=engine_policy,
    ).run()

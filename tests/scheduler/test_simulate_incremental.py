"""The incremental replay makes the decisions of a full pass at every event."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path

import pytest

from scheduler.engine import plan
from scheduler.model import (
    ClusterState,
    Gpu,
    Guarantee,
    Node,
    PendingJob,
    Plan,
    Policy,
    RunningJob,
    ShareNode,
)
from scheduler.priority import Ranker, rank_pending
from scheduler.simulate.backlog import _Backlog, _FreeUnits, _witnesses
from scheduler.simulate.run import Simulation, _EtaBudget, build_cluster, labportal_policy
from scheduler.simulate.workload import Workload, load_workload
from scheduler.workloads import PROFILES, Profile, generate, write


def _workload(tmp_path: Path, profile: str, days: float, seed: int = 3) -> Path:
    path = tmp_path / f"{profile}.csv"
    write(generate(Profile(**{**PROFILES[profile].__dict__, "days": days}), seed), str(path))
    return path


def _replay(path: Path, policy: str, gpus: int, *, incremental: bool) -> Simulation:
    workload = load_workload(
        str(path), users=20, seed=1, load=1.0, window="all", max_jobs=None, max_gpus_per_job=8
    )
    sim = Simulation(
        workload,
        policy,
        gpus=gpus,
        per_node=8,
        slot_gpus=1,
        slots_per_gpu=4,
        timeslot_s=4 * 3600.0,
        incremental=incremental,
    )
    sim.run()
    return sim


@pytest.mark.parametrize("policy", ["labportal", "fifo", "sjf-oracle"])
def test_the_incremental_replay_starts_the_same_jobs_at_the_same_times_on_the_same_gpus(
    tmp_path: Path, policy: str
) -> None:
    # A wide mix on too few GPUs: a backlog builds, guarantees hold GPUs idle.
    path = _workload(tmp_path, "wide", 6)
    full = _replay(path, policy, 16, incremental=False)
    fast = _replay(path, policy, 16, incremental=True)
    assert max(j.start or 0 for j in full.jobs) > 0
    assert [(j.start, j.gpu_ids) for j in fast.jobs] == [(j.start, j.gpu_ids) for j in full.jobs]
    if policy != "fifo":
        # Passes picked jobs from behind the head of the backlog (FIFO never backfills).
        assert fast.picked > 0
    # An estimate depends only on the jobs ahead: the sampled arrivals get the full
    # replay's estimates exactly.
    sampled = [j.index for j in fast.jobs if j.index not in fast.eta_skipped]
    assert len(sampled) > len(fast.jobs) // 4
    assert [fast.jobs[i].eta for i in sampled] == [full.jobs[i].eta for i in sampled]


def test_the_incremental_replay_passes_the_engine_a_prefix_not_the_backlog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _workload(tmp_path, "lab", 10)
    sizes: list[tuple[int, int]] = []
    original = _Backlog.prefix

    def spy(self: _Backlog, ranker: Ranker, size: int, must: object) -> list[PendingJob]:
        out = original(self, ranker, size, must)  # type: ignore[arg-type]
        sizes.append((len(out), len(self)))
        return out

    monkeypatch.setattr(_Backlog, "prefix", spy)
    _replay(path, "labportal", 8, incremental=True)
    deep = [(m, n) for m, n in sizes if n > 200]
    assert deep, "the workload should build a backlog of more than 200 jobs"
    assert sum(m for m, _ in deep) < 0.5 * sum(n for _, n in deep)


def _random_jobs(rng: random.Random, n: int) -> list[PendingJob]:
    users = [f"u{i}" for i in range(6)]
    jobs = []
    t = 0.0
    for i in range(n):
        t += rng.choice([0.0, 1.0, 50.0, 3000.0])
        slot = rng.random() < 0.2
        jobs.append(
            PendingJob(
                i,
                rng.choice(users),
                "debug" if slot else "normal",
                t,
                gpus=1 if slot else rng.choice([1, 2, 4, 8]),
                shared_slot=slot,
                time_limit_s=3600.0 if slot else rng.choice([3600.0, 86_400.0]),
                predicted_runtime_s=rng.uniform(60, 3600),
                category=rng.choice(["staff", "phd", "master"]),
            )
        )
    return jobs


@pytest.mark.parametrize("seed", range(5))
def test_the_backlog_prefix_is_the_head_of_the_engines_order(seed: int) -> None:
    rng = random.Random(seed)
    jobs = _random_jobs(rng, 300)
    policy = labportal_policy()
    users = sorted({j.user for j in jobs})
    state = ClusterState(
        nodes=(Node("n0"),),
        gpus=tuple(Gpu(f"g{i}", "n0", "A10", 24_000) for i in range(8)),
        pending=tuple(jobs),
        share_tree=ShareNode("lab", 1.0, tuple(ShareNode(u, 1.0) for u in users)),
        usage={u: rng.uniform(0, 1e6) for u in users},
    )
    now = jobs[-1].submit_time + rng.uniform(0, 3 * 86_400)
    backlog = _Backlog(policy)
    for job in jobs:
        backlog.add(job)
    for job in rng.sample(jobs, 40):
        backlog.remove(job.id)
    left = [j for j in jobs if j.id in backlog.jobs]
    expected = [
        r.job.id
        for r in rank_pending(
            ClusterState(
                state.nodes, state.gpus, tuple(left), share_tree=state.share_tree, usage=state.usage
            ),
            policy,
            now,
            {},
            8,
        )
    ]
    ranker = Ranker(state, policy, now, {}, 8)
    for size in (1, 17, 64, len(left)):
        assert [j.id for j in backlog.prefix(ranker, size, ())] == expected[:size]
    # A job asked for is included, however deep it ranks.
    deepest = expected[-1]
    assert backlog.prefix(ranker, 5, [deepest])[-1].id == deepest


def test_free_units_see_no_room_where_a_guarantee_leaves_too_short_a_window() -> None:
    nodes = (Node("n0"),)
    units = tuple(Gpu(f"g{i}", "n0", "A10", 24_000) for i in range(4))
    free = _FreeUnits(nodes, units)
    free.take(["g0", "g1"])
    assert free.any_fits_before({(False, 2, None): 3600.0}, {})
    assert not free.any_fits_before({(False, 3, None): 3600.0}, {})
    # g2 and g3 are promised to a blocked job in 30 minutes: an hour-long job cannot use them.
    windows = free.windows([(1000.0 + 1800.0, ("g2", "g3"))], 1000.0)
    assert not free.any_fits_before({(False, 1, None): 3600.0}, windows)
    assert free.any_fits_before({(False, 2, None): 1800.0}, windows)
    free.release(["g0"])
    assert free.any_fits_before({(False, 1, None): 3600.0}, windows)


def test_the_estimate_budget_is_linear_in_the_arrivals() -> None:
    budget = _EtaBudget()
    budget.left = 0
    granted = 0
    for _ in range(1000):
        budget.accrue()
        if budget.allows():
            granted += 1
            budget.spend(10 * _EtaBudget.PER_ARRIVAL)  # each forecast plays a deep backlog
    # About one arrival in ten is estimated; the forecasts played at most the grant.
    assert 90 <= granted <= 110


def test_a_plan_over_a_prefix_decides_its_jobs_as_a_plan_over_all() -> None:
    rng = random.Random(9)
    jobs = _random_jobs(rng, 120)
    policy = labportal_policy()
    users = sorted({j.user for j in jobs})
    state = ClusterState(
        nodes=(Node("n0"), Node("n1")),
        gpus=tuple(Gpu(f"n{n}-g{i}", f"n{n}", "A10", 24_000) for n in range(2) for i in range(8)),
        pending=tuple(jobs),
        share_tree=ShareNode("lab", 1.0, tuple(ShareNode(u, 1.0) for u in users)),
        usage={u: rng.uniform(0, 1e6) for u in users},
    )
    now = jobs[-1].submit_time
    whole: Plan = plan(state, policy, now)
    order = [r.job.id for r in rank_pending(state, policy, now, {}, 8)]
    head = set(order[:30])
    part = plan(
        ClusterState(
            state.nodes,
            state.gpus,
            tuple(j for j in jobs if j.id in head),
            share_tree=state.share_tree,
            usage=state.usage,
        ),
        policy,
        now,
    )
    assert part.starts == [s for s in whole.starts if s.job_id in head]
    assert {k: v for k, v in part.guarantees.items()} == {
        k: v for k, v in whole.guarantees.items() if k in head
    }
    assert all(isinstance(g, Guarantee) for g in part.guarantees.values())


@pytest.mark.parametrize("policy", ["labportal", "sjf-oracle"])
def test_the_incremental_replay_of_short_bursty_jobs_matches_the_full_replay(
    tmp_path: Path, policy: str
) -> None:
    # Many one-GPU and shared-slot jobs with short limits, per-user debug limits, and a
    # backlog on 8 GPUs: the jobs picked from behind the head are the ones that start.
    path = _workload(tmp_path, "bursty", 1.5, seed=5)
    full = _replay(path, policy, 8, incremental=False)
    fast = _replay(path, policy, 8, incremental=True)
    if policy == "labportal":
        assert fast.picked > 0  # shortest-first already ranks these jobs at the head
    assert [(j.start, j.gpu_ids) for j in fast.jobs] == [(j.start, j.gpu_ids) for j in full.jobs]


def _busy_cluster(
    rng: random.Random, now: float
) -> tuple[tuple[Node, ...], tuple[Gpu, ...], tuple[RunningJob, ...]]:
    """Four nodes of 8 GPUs (one split in 4 shared slots), about half of them running
    jobs that end at scattered times, so that guarantees leave windows to backfill."""
    nodes, units = build_cluster(32, 8, 1, 4)
    running = []
    for n, unit in enumerate(u for u in units if u.parent is None):
        if rng.random() < 0.55:
            running.append(
                RunningJob(
                    10_000 + n,
                    f"u{rng.randrange(6)}",
                    "normal",
                    (unit.id,),
                    now - rng.uniform(0, 3600),
                    rng.choice([1800.0, 3600.0, 4 * 3600.0, 86_400.0]),
                    category="phd",
                )
            )
    return nodes, units, tuple(running)


def _decide_once(
    base: ClusterState, jobs: list[PendingJob], users: list[str], policy: Policy, now: float
) -> tuple[Simulation, Plan]:
    """One incremental pass of a replay over `jobs` on `base`'s busy cluster (4 × 8 GPUs)."""
    assert base.share_tree is not None
    sim = Simulation(
        Workload([], users, {}, base.share_tree),
        "labportal",
        gpus=32,
        per_node=8,
        slot_gpus=1,
        slots_per_gpu=4,
        timeslot_s=4 * 3600.0,
        cluster=(base.nodes, base.gpus),
    )
    backlog = _Backlog(policy)
    for job in jobs:
        backlog.add(job)
    free = _FreeUnits(base.nodes, base.gpus)
    for r in base.running:
        free.take(r.gpu_ids)
    ranker = Ranker(base, policy, now, {}, 8)
    _head, part = sim._decide(backlog, ranker, base, free, now, (), False)
    return sim, part


@pytest.mark.parametrize("seed", range(8))
def test_a_pass_over_the_head_and_the_classes_that_could_start_starts_what_a_full_pass_starts(
    seed: int,
) -> None:
    rng = random.Random(seed)
    jobs = [
        replace(job, time_limit_s=rng.choice([600.0, 1800.0, job.time_limit_s, 3 * 86_400.0]))
        if not job.shared_slot
        else job
        for job in _random_jobs(rng, 400)
    ]
    now = jobs[-1].submit_time + rng.uniform(0, 86_400)
    nodes, units, running = _busy_cluster(rng, now)
    users = sorted({j.user for j in jobs})
    tree = ShareNode("lab", 1.0, tuple(ShareNode(u, 1.0) for u in users))
    usage = {u: rng.uniform(0, 1e6) for u in users}
    base = ClusterState(nodes, units, running=running, share_tree=tree, usage=usage)
    policy = labportal_policy()
    whole = plan(replace(base, pending=tuple(jobs)), policy, now, estimates=False)

    sim, part = _decide_once(base, jobs, users, policy, now)
    assert part.starts == whole.starts
    # Jobs were picked from behind the head, far fewer than the backlog.
    assert 0 < sim.picked < len(jobs) // 2


def test_the_jobs_behind_come_in_the_engines_order_class_by_class() -> None:
    rng = random.Random(4)
    jobs = _random_jobs(rng, 200)
    policy = labportal_policy()
    users = sorted({j.user for j in jobs})
    state = ClusterState(
        nodes=(Node("n0"),),
        gpus=tuple(Gpu(f"g{i}", "n0", "A10", 24_000) for i in range(8)),
        pending=tuple(jobs),
        share_tree=ShareNode("lab", 1.0, tuple(ShareNode(u, 1.0) for u in users)),
        usage={u: rng.uniform(0, 1e6) for u in users},
    )
    now = jobs[-1].submit_time + 3600.0
    backlog = _Backlog(policy)
    for job in jobs:
        backlog.add(job)
    order = [r.job.id for r in rank_pending(state, policy, now, {}, 8)]
    ranker = Ranker(state, policy, now, {}, 8)
    every = {key: 0 for key in backlog.classes}
    assert [j.id for j in backlog.behind(ranker, every, 50)] == order[:50]
    # Two classes only, from their third job on: those jobs, in the engine's order.
    chosen = dict(list(every.items())[:2])
    wanted = [
        i
        for i in order
        if any(backlog.jobs[i].id in {m[1] for m in backlog.classes[k][2:]} for k in chosen)
    ]
    picked = backlog.behind(ranker, {key: 2 for key in chosen}, 1000)
    assert [j.id for j in picked] == wanted


def test_jobs_that_no_node_can_hold_prove_it_for_their_whole_shape() -> None:
    rng = random.Random(21)
    # A third of the backlog asks for a GPU model the cluster lacks (a what-if replay
    # that removed it): those jobs never start, and need not be shown to every pass.
    jobs = [
        replace(job, gpu_model="H100") if not job.shared_slot and i % 3 == 0 else job
        for i, job in enumerate(_random_jobs(rng, 300))
    ]
    now = jobs[-1].submit_time + 3600.0
    nodes, units, running = _busy_cluster(rng, now)
    users = sorted({j.user for j in jobs})
    tree = ShareNode("lab", 1.0, tuple(ShareNode(u, 1.0) for u in users))
    base = ClusterState(nodes, units, running=running, share_tree=tree, usage={})
    policy = labportal_policy()
    whole = plan(replace(base, pending=tuple(jobs)), policy, now, estimates=False)
    _sim, part = _decide_once(base, jobs, users, policy, now)
    assert part.starts == whole.starts
    # One of them failing proves it for the others of its shape, whatever their limit.
    failed, _limited = _witnesses(jobs, whole)
    assert failed[(False, 2, "H100")] == -math.inf


def test_the_replay_applies_the_engines_preemptions_and_every_job_does_its_work_once(
    tmp_path: Path,
) -> None:
    path = _workload(tmp_path, "lab", 8, seed=5)
    workload = load_workload(
        str(path), users=20, seed=1, load=1.0, window="all", max_jobs=None, max_gpus_per_job=8
    )
    policy = replace(
        labportal_policy(), preempt_starving_after_s=6 * 3600.0, preempt_share_after_s=600.0
    )
    sim = Simulation(
        workload,
        "labportal",
        gpus=16,
        per_node=8,
        slot_gpus=1,
        slots_per_gpu=4,
        timeslot_s=4 * 3600.0,
        policy=policy,
    )
    metrics = sim.run()
    assert metrics["preemptions"] == sim.preemptions > 0
    preempted = [j for j in sim.jobs if j.runs]
    assert preempted and all(j.preemptible for j in preempted)
    for job in sim.jobs:
        assert job.start is not None and job.end is not None, job.index
        runs = job.runs or ((job.start, job.end),)
        # In order, apart, after the submit; together exactly the job's run time (it
        # resumes from its checkpoint); the last one is its end.
        assert runs[0][0] == job.start >= job.submit
        assert all(a[1] <= b[0] for a, b in zip(runs, runs[1:], strict=False))
        assert math.isclose(sum(e - s for s, e in runs), job.duration, abs_tol=1e-6)
        assert runs[-1][1] == job.end


def test_the_full_pass_replay_refuses_preemption_it_would_not_apply(tmp_path: Path) -> None:
    workload = load_workload(
        str(_workload(tmp_path, "lab", 1)),
        users=5,
        seed=1,
        load=1.0,
        window="all",
        max_jobs=None,
        max_gpus_per_job=8,
    )
    with pytest.raises(ValueError, match="applies no preemptions"):
        Simulation(
            workload,
            "labportal",
            gpus=8,
            per_node=8,
            slot_gpus=0,
            slots_per_gpu=4,
            timeslot_s=4 * 3600.0,
            policy=replace(labportal_policy(), preempt_share_after_s=0.0),
            incremental=False,
        )

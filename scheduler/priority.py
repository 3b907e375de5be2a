"""Job order: tiers first, then Slurm-style multifactor priority.

Tier ranks (lower runs first): 0 emergency, 1 reservation job inside its window,
then ``2 + queue.tier`` (so queue tier 0, e.g. ``high``, comes before tier 1 ...).
Inside a tier, jobs of users with credit come before jobs of users at or below zero,
then higher priority, then earlier submit, then lower id.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from scheduler.fairshare import fairshare_factors
from scheduler.model import ClusterState, PendingJob, Policy, Reservation

TIER_EMERGENCY = 0
TIER_RESERVATION = 1
TIER_QUEUE_BASE = 2


@dataclass(frozen=True, slots=True)
class RankedJob:
    """A pending job with its tier rank and multifactor priority."""

    job: PendingJob
    tier: int
    priority: float
    sort_key: tuple[float, ...]


def in_reservation_window(
    job: PendingJob, reservations: Mapping[int, Reservation], now: float
) -> bool:
    """True if the job belongs to a reservation of its own user that is active at ``now``."""
    if job.reservation_id is None:
        return False
    reservation = reservations.get(job.reservation_id)
    return (
        reservation is not None
        and reservation.user == job.user
        and reservation.start <= now < reservation.end
    )


def job_tier(
    job: PendingJob, policy: Policy, reservations: Mapping[int, Reservation], now: float
) -> int:
    """The tier rank of a job; lower ranks are scheduled first."""
    if job.emergency:
        return TIER_EMERGENCY
    if in_reservation_window(job, reservations, now):
        return TIER_RESERVATION
    queue = policy.queues.get(job.queue)
    return TIER_QUEUE_BASE + (queue.tier if queue is not None else policy.unknown_queue_tier)


def multifactor_priority(
    job: PendingJob,
    policy: Policy,
    now: float,
    fairshare: float,
    largest_node_units: int,
) -> float:
    """``W_age·age + W_fs·fairshare + W_queue·queue + W_cat·category + W_size·size``."""
    age = min(1.0, max(0.0, now - job.submit_time) / policy.max_age_s) if policy.max_age_s else 0.0
    queue = policy.queues.get(job.queue)
    queue_factor = queue.priority_factor if queue is not None else 0.0
    category = policy.categories.get(job.category)
    category_factor = category.factor if category is not None else 0.0
    size = min(1.0, job.gpus / largest_node_units) if largest_node_units > 0 else 0.0
    if policy.size_favours_small:
        size = 1.0 - size
    return (
        policy.weight_age * age
        + policy.weight_fairshare * fairshare
        + policy.weight_queue * queue_factor
        + policy.weight_category * category_factor
        + policy.weight_size * size
    )


def rank_pending(
    state: ClusterState,
    policy: Policy,
    now: float,
    reservations: Mapping[int, Reservation],
    largest_node_units: int,
) -> list[RankedJob]:
    """Return every pending job in scheduling order (deterministic for equal inputs)."""
    factors: dict[str, float] = (
        fairshare_factors(state.share_tree, state.usage) if state.share_tree is not None else {}
    )
    broke = state.users_without_credit
    ranked: list[RankedJob] = []
    # The queue, category and size terms repeat across thousands of jobs: compute once.
    constant: dict[tuple[str, str, int], float] = {}
    w_age, w_fs = policy.weight_age, policy.weight_fairshare
    max_age = policy.max_age_s
    for job in state.pending:
        if policy.order == "fifo":
            tier, priority = 0, 0.0
            key: tuple[float, ...] = (job.submit_time, job.id)
        elif policy.order == "shortest_first":
            tier, priority = 0, 0.0
            runtime = job.predicted_runtime_s
            key = (runtime if runtime is not None else job.time_limit_s, job.submit_time, job.id)
        else:
            tier = job_tier(job, policy, reservations, now)
            triple = (job.queue, job.category, job.gpus)
            base = constant.get(triple)
            if base is None:
                base = constant[triple] = multifactor_priority(
                    replace(job, submit_time=now), policy, now, 0.0, largest_node_units
                )
            age = min(1.0, max(0.0, now - job.submit_time) / max_age) if max_age else 0.0
            priority = base + w_age * age + w_fs * factors.get(job.user, 0.0)
            key = (tier, 1 if job.user in broke else 0, -priority, job.submit_time, job.id)
        ranked.append(RankedJob(job, tier, priority, key))
    ranked.sort(key=lambda item: item.sort_key)
    return ranked

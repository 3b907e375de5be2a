"""Job order: tiers first, then Slurm-style multifactor priority.

Tier ranks (lower runs first): 0 emergency, 1 reservation job inside its window,
then ``2 + queue.tier`` (so queue tier 0, e.g. ``high``, comes before tier 1 ...).
Inside a tier, jobs of users with credit come before jobs of users at or below zero,
then higher priority, then earlier submit, then lower id.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from operator import attrgetter

from scheduler.fairshare import fairshare_factors
from scheduler.model import ClusterState, PendingJob, Policy, Reservation

TIER_EMERGENCY = 0
TIER_RESERVATION = 1
TIER_QUEUE_BASE = 2


@dataclass(slots=True)
class RankedJob:
    """A pending job with its tier rank and multifactor priority (not frozen: a pass
    builds one per pending job, and a frozen dataclass is twice as slow to build)."""

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


def constant_terms(job: PendingJob, policy: Policy, largest_node_units: int) -> float:
    """The priority terms that do not change while a job waits (queue, category, size,
    short job): the priority at the job's own submit time with no fair share and no
    attained-service term (age is then 0)."""
    return multifactor_priority(job, policy, job.submit_time, 0.0, largest_node_units, 0.0)


def multifactor_priority(
    job: PendingJob,
    policy: Policy,
    now: float,
    fairshare: float,
    largest_node_units: int,
    attained: float = 1.0,
) -> float:
    """``W_age·age + W_fs·fairshare + W_queue·queue + W_cat·category + W_size·size
    + W_attained·attained + W_short·short`` (``attained``: see ``attained_factors``)."""
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
        + policy.weight_attained * attained
        + (policy.weight_short * short_factor(job, policy) if policy.weight_short else 0.0)
    )


def attained_factors(state: ClusterState, policy: Policy, now: float) -> dict[str, float]:
    """Least attained service (Tiresias), per user, in discretised queues.

    A user's attained service is what their running jobs hold: GPUs (units), or with
    ``attained_2d`` GPU-seconds run so far (Tiresias's 2D attained service). It falls
    into queue q = the number of ``attained_thresholds`` it reaches, and the factor is
    ``1 - q / len(thresholds)``. Users with nothing running are absent (factor 1).
    Discrete queues, not a continuous value: users in one queue keep their order by the
    other terms, so the term only moves users who hold clearly more than others."""
    thresholds = sorted(policy.attained_thresholds)
    if not thresholds:
        return {}
    attained: dict[str, float] = {}
    for job in state.running:
        units = len(job.gpu_ids)
        amount = units * max(0.0, now - job.start_time) if policy.attained_2d else float(units)
        attained[job.user] = attained.get(job.user, 0.0) + amount
    levels = len(thresholds)
    return {
        user: 1.0 - bisect.bisect_right(thresholds, amount) / levels
        for user, amount in attained.items()
    }


def short_level(job: PendingJob, policy: Policy) -> int:
    """The short-job level of a job: 0 for a limit at or under ``short_range_s[0]``,
    ``short_levels`` at or over ``short_range_s[1]``, log-spaced between. The limit,
    not the predicted run time: it is what the user states for this job (predictions
    are per user and command, and ordered jobs worse in the simulator)."""
    levels = policy.short_levels
    if not policy.weight_short or levels <= 0:
        return 0
    limit = job.time_limit_s
    low, high = policy.short_range_s
    if limit <= low:
        return 0
    if limit >= high:
        return levels
    return min(levels, int(levels * math.log(limit / low) / math.log(high / low)) + 1)


def short_factor(job: PendingJob, policy: Policy) -> float:
    """``1 - level / short_levels``: 1 for the shortest jobs, 0 for the longest."""
    levels = policy.short_levels
    return 1.0 - short_level(job, policy) / levels if levels > 0 else 0.0


class Ranker:
    """The sort key of a pending job at one instant: fair-share factors and the constant
    terms are worked out once, so that keying thousands of jobs is cheap. Used by
    ``rank_pending`` and by the simulator's incremental backlog (same keys, same order)."""

    def __init__(
        self,
        state: ClusterState,
        policy: Policy,
        now: float,
        reservations: Mapping[int, Reservation],
        largest_node_units: int,
    ) -> None:
        self.policy = policy
        self.now = now
        self.reservations = reservations
        self.largest_node_units = largest_node_units
        self.factors: dict[str, float] = (
            fairshare_factors(state.share_tree, state.usage) if state.share_tree is not None else {}
        )
        self.broke = state.users_without_credit
        # The queue, category, size and short-job terms repeat across thousands of jobs
        # (limits are mostly a few standard values): compute once.
        self.constant: dict[tuple[str, str, int, float], float] = {}
        self.static = policy.order in ("fifo", "shortest_first")
        self.attained: dict[str, float] = (
            attained_factors(state, policy, now)
            if policy.weight_attained and not self.static
            else {}
        )

    @staticmethod
    def static_key(job: PendingJob, policy: Policy) -> tuple[float, ...]:
        """The key under the orders that do not change with time (fifo, shortest_first)."""
        if policy.order == "fifo":
            return (job.submit_time, job.id)
        runtime = job.predicted_runtime_s
        return (runtime if runtime is not None else job.time_limit_s, job.submit_time, job.id)

    def rank(self, job: PendingJob) -> RankedJob:
        policy = self.policy
        now = self.now
        if self.static:
            return RankedJob(job, 0, 0.0, self.static_key(job, policy))
        if job.emergency or job.reservation_id is not None:
            tier = job_tier(job, policy, self.reservations, now)
        else:
            queue = policy.queues.get(job.queue)
            tier = TIER_QUEUE_BASE + (
                queue.tier if queue is not None else policy.unknown_queue_tier
            )
        terms = (job.queue, job.category, job.gpus, job.time_limit_s)
        base = self.constant.get(terms)
        if base is None:
            base = self.constant[terms] = constant_terms(job, policy, self.largest_node_units)
        max_age = policy.max_age_s
        age = min(1.0, max(0.0, now - job.submit_time) / max_age) if max_age else 0.0
        priority = (
            base
            + policy.weight_age * age
            + policy.weight_fairshare * self.factors.get(job.user, 0.0)
            + policy.weight_attained * self.attained.get(job.user, 1.0)
        )
        key = (tier, 1 if job.user in self.broke else 0, -priority, job.submit_time, job.id)
        return RankedJob(job, tier, priority, key)


def rank_pending(
    state: ClusterState,
    policy: Policy,
    now: float,
    reservations: Mapping[int, Reservation],
    largest_node_units: int,
) -> list[RankedJob]:
    """Return every pending job in scheduling order (deterministic for equal inputs)."""
    ranker = Ranker(state, policy, now, reservations, largest_node_units)
    ranked = [ranker.rank(job) for job in state.pending]
    ranked.sort(key=attrgetter("sort_key"))
    return ranked

"""Slurm's classic fair-share factor over a share tree of any depth.

``F = 2^(-U_E/S)`` where ``S`` is the user's normalised share (product down the tree
of shares over siblings' shares) and ``U_E`` the effective usage, computed top down:
``U_E = U_N + (U_E,parent - U_N) * S_raw / S_raw_siblings``. Children of the root take
their own normalised usage as effective usage, as in Slurm's worked example.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduler.model import ShareNode


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """GPU-seconds a user consumed, accounted at ``time``; ``usage_factor`` is the queue's."""

    user: str
    time: float
    gpu_seconds: float
    usage_factor: float = 1.0


def decayed_usage(
    records: Iterable[UsageRecord], now: float, half_life_s: float
) -> dict[str, float]:
    """Sum each user's usage, each record halved for every ``half_life_s`` it is older than now."""
    usage: dict[str, float] = {}
    for record in records:
        age = max(0.0, now - record.time)
        weight = 0.5 ** (age / half_life_s) if half_life_s > 0 else 1.0
        usage[record.user] = (
            usage.get(record.user, 0.0) + record.gpu_seconds * record.usage_factor * weight
        )
    return usage


def normalize_usage(usage: Mapping[str, float]) -> dict[str, float]:
    """Divide every user's usage by everyone's total, so the values sum to 1 (or are all 0)."""
    total = sum(max(0.0, value) for value in usage.values())
    if total <= 0:
        return dict.fromkeys(usage, 0.0)
    return {user: max(0.0, value) / total for user, value in usage.items()}


# The last answer: a simulator pass asks twice for the same tree and usage (once to
# order its backlog, once inside the engine). Trees are immutable; usage is compared.
_last: tuple[ShareNode, dict[str, float], bool, dict[str, float]] | None = None


def fairshare_factors(
    tree: ShareNode, usage: Mapping[str, float], *, normalize: bool = True
) -> dict[str, float]:
    """Return the classic fair-share factor in [0, 1] of every leaf (user) of ``tree``.

    ``usage`` is decayed raw usage per user; with ``normalize=False`` it is taken as
    already normalised (Slurm's worked example gives normalised values).
    """
    global _last
    last = _last
    if last is not None and last[0] is tree and last[2] == normalize and last[1] == usage:
        return dict(last[3])
    factors = _fairshare_factors(tree, usage, normalize=normalize)
    _last = (tree, dict(usage), normalize, dict(factors))
    return factors


def _fairshare_factors(
    tree: ShareNode, usage: Mapping[str, float], *, normalize: bool
) -> dict[str, float]:
    normalised = normalize_usage(usage) if normalize else dict(usage)
    subtree_usage: dict[int, float] = {}

    def total_usage(node: ShareNode) -> float:
        if not node.children:
            value = normalised.get(node.name, 0.0)
        else:
            value = sum(total_usage(child) for child in node.children)
        subtree_usage[id(node)] = value
        return value

    total_usage(tree)
    factors: dict[str, float] = {}
    # Iterative walk so deep trees cannot hit the recursion limit: (node, S, U_E).
    work: list[tuple[ShareNode, float, float]] = []
    top_total = sum(max(0.0, child.shares) for child in tree.children)
    for child in tree.children:
        share = child.shares / top_total if top_total > 0 else 0.0
        work.append((child, share, subtree_usage[id(child)]))
    while work:
        node, share, effective = work.pop()
        if not node.children:
            factors[node.name] = _factor(effective, share)
            continue
        siblings = sum(max(0.0, child.shares) for child in node.children)
        for child in node.children:
            ratio = child.shares / siblings if siblings > 0 else 0.0
            own = subtree_usage[id(child)]
            work.append((child, share * ratio, own + (effective - own) * ratio))
    return factors


def _factor(effective_usage: float, share: float) -> float:
    if share <= 0:
        return 0.0
    return math.pow(2.0, -effective_usage / share)

"""Summaries of a list of numbers; plain Python (no Django), so every package may use them."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], pct: float) -> float:
    """The `pct`-th percentile (0 to 100) of `values`, which must not be empty.

    Linear interpolation between closest ranks (numpy's default).
    """
    ordered = sorted(values)
    k = (len(ordered) - 1) * pct / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)

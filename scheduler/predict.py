"""Runtime prediction from finished jobs.

Jobs are keyed, most specific first, by (user, image, command shape, GPU count),
(user, image, command shape), (user, image) and user. The most specific key with
history answers, with the median of its recent run times. At the user level the
user's median *fraction of the time limit used* is applied to this job's limit,
since one user's jobs differ in length far more than their habits in asking for
time do. No history: the time limit. Every prediction is capped at the limit.
"""

from __future__ import annotations

import hashlib
import re
import statistics
from collections import deque
from dataclasses import dataclass

# Every pattern here is linear in the command's length: a path starts only where a run
# of path characters starts (the lookbehind), and no quantifier gives back what it took
# (*+, {8,}+), so a long word is scanned once, not once per character it holds (the old
# ``(?:[\w.-]*/)+[\w.-]*`` took seconds on a 40,000-character word).
_PATH = re.compile(r"(?<![\w./-])[\w.-]*+/[\w./-]*+")
_HEX = re.compile(r"\b[0-9a-f]{8,}+\b")
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e-?\d+)?")
_SPACE = re.compile(r"\s+")


def command_shape(command: str) -> str:
    """Normalise a command so that runs of the same script with other paths, seeds or
    hyper-parameters share a key: paths become ``<path>``, numbers ``#``."""
    shape = _PATH.sub("<path>", command.strip().lower())
    shape = _HEX.sub("<hex>", shape)
    shape = _NUMBER.sub("#", shape)
    return _SPACE.sub(" ", shape)


def command_shape_key(command: str) -> str:
    """A short, fixed-length key for the command's shape: equal for equal shapes, so it
    can be stored with a job and compared without the (possibly long) shape itself."""
    return hashlib.blake2b(command_shape(command).encode(), digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class JobFeatures:
    """What is known of a job before it runs."""

    user: str
    image: str
    # An opaque key: jobs with the same one are runs of the same script (the portal
    # passes command_shape_key of the command; the simulator, its own labels).
    shape: str
    gpus: int


class RuntimePredictor:
    """Learns run times online; ``predict`` never exceeds the time limit."""

    def __init__(self, window: int = 20) -> None:
        self.window = window
        self._runtimes: dict[tuple[object, ...], deque[float]] = {}
        self._fractions: dict[str, deque[float]] = {}

    def _keys(self, features: JobFeatures) -> list[tuple[object, ...]]:
        shape = features.shape
        return [
            ("job", features.user, features.image, shape, features.gpus),
            ("shape", features.user, features.image, shape),
            ("image", features.user, features.image),
        ]

    def observe(self, features: JobFeatures, runtime_s: float, time_limit_s: float) -> None:
        """Record a finished job's run time (and how much of its limit it used)."""
        for key in self._keys(features):
            history = self._runtimes.get(key)
            if history is None:
                history = self._runtimes[key] = deque(maxlen=self.window)
            history.append(runtime_s)
        if time_limit_s > 0:
            fractions = self._fractions.get(features.user)
            if fractions is None:
                fractions = self._fractions[features.user] = deque(maxlen=self.window)
            fractions.append(min(1.0, runtime_s / time_limit_s))

    def predict(self, features: JobFeatures, time_limit_s: float) -> float:
        """Predicted run time in seconds, at most ``time_limit_s``."""
        for key in self._keys(features):
            history = self._runtimes.get(key)
            if history:
                return min(time_limit_s, statistics.median(history))
        fractions = self._fractions.get(features.user)
        if fractions:
            return time_limit_s * statistics.median(fractions)
        return time_limit_s


# Start estimates err most when far ahead. Past ``RANGE_FROM_S`` of lead, a start is
# shown as a range: the lead scaled by the quartiles of actual wait / estimated wait
# that the simulator measures (``eta_lead_ratio_p25_p75``) on tuning workloads, not the
# held-out ones: lab seed 11 gave 0.2 / 4.5, wide seed 12 gave 2.7 / 10.7. Far-off
# estimates mostly come true late (jobs of users with more fair share arrive and go
# ahead), so the range reaches further after the estimate than before it. The bounds
# follow the lab-like mix; on training-heavy mixes the late bound is still too early.
RANGE_FROM_S = 3600.0
RANGE_EARLY = 0.25
RANGE_LATE = 5.0
# Nearer estimates are off by about as many seconds whatever their lead, so their range
# reaches a fixed time past the estimate: the quartiles of actual minus estimated start
# for jobs estimated to start within the hour (``eta_near_delay_p25_p75_s``, tuning
# workloads, not the held-out ones) were -19 / 4,416 s on lab seed 11, 1,813 / 25,612 s
# on wide seed 12 and 6,337 / 79,134 s on wide-only seed 18. The late bound follows the
# lab-like mix, as above; the early bound is the far ranges' (a quarter of the lead).
RANGE_NEAR_LATE_S = 4500.0


def start_estimate_range(now: float, estimated: float) -> tuple[float, float] | None:
    """(earliest, latest) likely start for an estimate ``estimated`` made at ``now``, or
    None where the estimate is not ahead of ``now`` (shown as one time)."""
    lead = estimated - now
    if lead <= 0:
        return None
    if lead < RANGE_FROM_S:
        return now + RANGE_EARLY * lead, estimated + RANGE_NEAR_LATE_S
    return now + RANGE_EARLY * lead, now + RANGE_LATE * lead

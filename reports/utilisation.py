"""Where the reports read how hard the GPUs really worked.

Every figure of "really used" GPU-hours goes through `job_mean_utilisation`, so the
source (raw samples today, the hourly rollups once telemetry keeps them) is one
function to change.
"""

from __future__ import annotations

import datetime as dt

from django.db.models import Avg

from telemetry.models import GpuSample


def job_mean_utilisation(*, start: dt.datetime, end: dt.datetime) -> dict[int, float]:
    """Mean GPU utilisation (0..1) of each job that has telemetry in [start, end)."""
    rows = (
        GpuSample.objects.filter(
            ts__gte=start, ts__lt=end, job_id__isnull=False, util_pct__isnull=False
        )
        .order_by()
        .values("job_id")
        .annotate(mean=Avg("util_pct"))
    )
    return {row["job_id"]: row["mean"] / 100.0 for row in rows}

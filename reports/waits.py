"""Waits per queue: how long the jobs that started in the period waited, as a mean and
percentiles (which need every wait)."""

from __future__ import annotations

import numpy as np

from core.stats import percentile
from reports.jobtable import JobTable
from reports.lines import WaitLine
from reports.periods import Period


def queue_waits(period: Period, table: JobTable, queue_names: dict[int, str]) -> list[WaitLine]:
    """Waits per queue of the jobs that started in the period (percentiles need every wait),
    from the period's jobs (`job_table`)."""
    queue_ids, jobs = table.queue_ids, table.jobs
    if not len(jobs):
        return []
    started, submitted = jobs[:, 4], jobs[:, 3]
    in_period = (started >= period.start.timestamp()) & (started < period.end.timestamp())
    waits = []
    for queue_id in np.unique(queue_ids[in_period]):
        wait_h = ((started - submitted)[in_period & (queue_ids == queue_id)] / 3600).tolist()
        waits.append(
            WaitLine(
                queue_names.get(int(queue_id), "—"),
                len(wait_h),
                sum(wait_h) / len(wait_h),
                percentile(wait_h, 50),
                percentile(wait_h, 95),
            )
        )
    return sorted(waits, key=lambda w: w.queue)

"""The period's jobs, read once, and the names of what a report groups them by.

`job_table` reads every job of the period as one row of numbers (`JobTable`: packed as
float8 by PostgreSQL, see `reports.sql.fetch_floats`); `job_groups` sums it per (owner,
queue, node, first GPU). `LabNames` turns those ids into the names the report's lines
carry (user, category, queue, node, GPU model, project).
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.db.models import Case, FloatField, IntegerField, OuterRef, Q, Subquery, Value, When
from django.db.models.functions import Cast, Coalesce, NullIf
from django.utils.translation import gettext

from accounts.models import Project, User
from cluster.models import Gpu, Node
from jobqueue import executor
from jobqueue.models import Allocation, Job, Queue
from reports.lines import FINAL_STATES, NO_CATEGORY, NO_PROJECT
from reports.periods import Period
from reports.sql import EpochSeconds, fetch_floats


def runs_in(lo: dt.datetime, hi: dt.datetime) -> Q:
    """Jobs that ran at some time in [lo, hi)."""
    return Q(started_at__lt=hi) & (Q(ended_at__isnull=True) | Q(ended_at__gt=lo))


def period_jobs(period: Period, names: LabNames | None = None) -> Any:
    """Every job that waited, ran or ended in the period, with its units (whole-GPU
    equivalents held while running) and, on a node with GPUs of several models, its first
    allocated GPU (`alloc_gpu`; `LabNames.model_of` names the model of any job)."""
    first_alloc = Allocation.objects.filter(job=OuterRef("pk")).order_by("id")
    slots = Subquery(first_alloc.values("gpu__parent__shared_slots")[:1])
    return (
        Job.objects.filter(submitted_at__lt=period.end)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gte=period.start))
        .exclude(state=Job.State.HELD)
        .order_by()
        .annotate(
            alloc_gpu=first_gpu_on_mixed_nodes(names)
            if names is not None
            else Value(None, output_field=IntegerField()),
            units=Case(
                When(
                    shared_slot=True,
                    then=Coalesce(
                        1.0 / Cast(NullIf(slots, 0), FloatField()), Cast("gpus", FloatField())
                    ),
                ),
                default=Cast("gpus", FloatField()),
                output_field=FloatField(),
            ),
        )
    )


DIMENSION_FIELDS = ("owner_id", "queue_id", "node_id", "alloc_gpu", "project_id")
# The same as telemetry rollups reach them (the model of the GPU measured).
ROLLUP_DIMENSION_FIELDS = {
    "user": "user_id",  # the rollup keeps the job's owner: no join for it
    "queue": "job__queue_id",
    "node": "job__node_id",
    "model": "gpu__model",
    "project": "job__project_id",
}


@dataclass
class LabNames:
    """Names of the ids a report groups by. The GPU model of a job is its node's, where the
    node has GPUs of one model, else that of its first allocated GPU."""

    users: dict[int, tuple[str, str | None]]  # id → (username, category name)
    queues: dict[int, str]
    nodes: dict[int, str]
    gpu_models: dict[int, str]
    node_models: dict[int, str]
    mixed_nodes: list[int]
    projects: dict[int, str]

    def model_of(self, node_id: int | None, alloc_gpu: int | None) -> str | None:
        if alloc_gpu is not None:
            return self.gpu_models.get(alloc_gpu)
        return self.node_models.get(node_id or 0)

    def keys(
        self,
        user_id: int | None,
        queue_id: int | None,
        node_id: int | None,
        model: str | None,
        project_id: int | None,
    ) -> tuple[str, ...]:
        """(user, category, queue, node, model, project) as the report's lines name them."""
        user, category = self.users.get(user_id or 0, ("", None))
        return (
            user or "—",
            category or NO_CATEGORY,
            self.queues.get(queue_id or 0) or "—",
            self.nodes.get(node_id or 0) or "—",
            model or "—",
            self.projects.get(project_id or 0) or NO_PROJECT,
        )


def lab_names() -> LabNames:
    gpus = list(Gpu.objects.values_list("pk", "model", "node_id"))
    per_node: dict[int, set[str]] = defaultdict(set)
    for _pk, model, node_id in gpus:
        per_node[node_id].add(model)
    return LabNames(
        users={
            pk: (name, category)
            for pk, name, category in User.objects.values_list("pk", "username", "category__name")
        },
        queues={
            **dict(Queue.objects.values_list("pk", "name")),
            OUTSIDE_QUEUE: gettext("outside the portal"),
        },
        nodes=dict(Node.objects.values_list("pk", "name")),
        gpu_models={pk: model for pk, model, _node in gpus},
        node_models={node: next(iter(m)) for node, m in per_node.items() if len(m) == 1},
        mixed_nodes=[node for node, m in per_node.items() if len(m) > 1],
        projects=dict(Project.objects.values_list("pk", "name")),
    )


def first_gpu_on_mixed_nodes(names: LabNames, job: str = "pk", node: str = "node_id") -> Any:
    """The job's first allocated GPU if it ran on a node of several models, else NULL: a
    lookup per job costs more than the rest of a report's GROUP BY, so only those pay it."""
    if not names.mixed_nodes:
        return Value(None, output_field=IntegerField())
    first = Allocation.objects.filter(job=OuterRef(job)).order_by("id").values("gpu_id")[:1]
    return Case(
        When(**{f"{node}__in": names.mixed_nodes}, then=Subquery(first)),
        default=None,
        output_field=IntegerField(),
    )


# Columns of the job array the unmet-demand sweep reads (times in seconds since 1970;
# NaN where a job has not started or not ended).
SWEEP_COLUMNS = ("units", "gpus", "shared_slot", "submitted", "started", "ended")


@dataclass
class JobTable:
    """The period's jobs as numbers, one row per job: `jobs` has the SWEEP_COLUMNS; `ids`
    the queue, owner, node, first GPU on a mixed node (`period_jobs`), the index of the
    final state in FINAL_STATES (-1 for none) and the project; NaN where a value is NULL."""

    ids: np.ndarray
    jobs: np.ndarray

    @property
    def queue_ids(self) -> np.ndarray:
        return self.ids[:, 0]


ID_COLUMNS = ("queue_id", "owner_id", "node_id", "alloc_gpu", "final_state", "project_id")
GROUP_COLUMNS = [0, 1, 2, 3, 5]  # what `job_groups` sums per: all but the final state


def job_table(period: Period, names: LabNames) -> JobTable:
    """Every job of the period as numbers (`JobTable`), fetched without Django's per-value
    converters (a year is 100,000 rows; see `fetch_floats`)."""
    final_state = Case(
        *(When(state=state, then=Value(i)) for i, state in enumerate(FINAL_STATES)),
        default=Value(-1),
        output_field=IntegerField(),
    )
    query = (
        period_jobs(period, names)
        .annotate(final_state=final_state)
        .values_list(
            *ID_COLUMNS,
            "units",
            "gpus",
            Cast("shared_slot", IntegerField()),
            EpochSeconds("submitted_at"),
            EpochSeconds("started_at"),
            EpochSeconds("ended_at"),
        )
    )
    sql, params = query.query.sql_with_params()
    table = fetch_floats(sql, params, len(ID_COLUMNS) + len(SWEEP_COLUMNS))
    outside = outside_rows(period, names)
    if len(outside):
        table = np.vstack([table, outside])
    ids, jobs = table[:, : len(ID_COLUMNS)], table[:, len(ID_COLUMNS) :]
    units = jobs[:, 0]
    jobs[:, 0] = np.where(np.isnan(units), jobs[:, 1], units)
    return JobTable(ids, jobs)


# The queue line of jobs that ran outside the portal under no portal queue's QOS.
OUTSIDE_QUEUE = 2**31


def outside_rows(period: Period, names: LabNames) -> np.ndarray:
    """The executor's jobs that the portal did not submit (plain sbatch), as rows of the job
    table, so every figure of the report (totals, tables, weeks, waits, unmet demand)
    counts their GPU time as the cluster's accounting does."""
    jobs = executor.current().jobs_outside_portal(start=period.start, end=period.end)
    if not jobs:
        return np.empty((0, len(ID_COLUMNS) + len(SWEEP_COLUMNS)))
    node_ids = {name: pk for pk, name in names.nodes.items()}
    nan = math.nan

    def seconds(moment: dt.datetime | None) -> float:
        return moment.timestamp() if moment is not None else nan

    return np.array(
        [
            [
                job.queue_id if job.queue_id is not None else OUTSIDE_QUEUE,
                job.user_id if job.user_id is not None else nan,
                node_ids.get(job.node, nan),
                nan,  # no first GPU: the node's model names it
                FINAL_STATES.index(job.final_state) if job.final_state in FINAL_STATES else -1,
                job.project_id if job.project_id is not None else nan,
                float(job.gpus),
                float(job.gpus),
                0.0,
                seconds(job.submitted_at or job.started_at),
                seconds(job.started_at),
                seconds(job.ended_at),
            ]
            for job in jobs
        ],
        dtype=float,
    )


def _groups_of(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of `keys` (integers) and each row's index among them, as
    `np.unique(keys, axis=0, return_inverse=True)` gives them, ten times faster: each
    column's values numbered densely, the numbers combined into one integer per row."""
    uniques, codes = [], []
    for column in keys.T:
        values, code = np.unique(column, return_inverse=True)
        uniques.append(values)
        codes.append(code.reshape(-1))
    if math.prod(len(values) for values in uniques) >= 2**62:
        groups, inverse = np.unique(keys, axis=0, return_inverse=True)
        return groups, inverse.reshape(-1)
    combined = np.zeros(len(keys), dtype=np.int64)
    for values, code in zip(uniques, codes, strict=True):
        combined = combined * len(values) + code
    distinct, inverse = np.unique(combined, return_inverse=True)
    columns = []
    for values in reversed(uniques):
        columns.append(values[distinct % len(values)])
        distinct = distinct // len(values)
    return np.column_stack(columns[::-1]), inverse.reshape(-1)


def job_groups(
    period: Period, end: dt.datetime, table: JobTable
) -> Iterator[tuple[int | None, int | None, int | None, int | None, int | None, float, list[int]]]:
    """Per (owner, queue, node, first GPU, project) of the period's jobs: the allocated GPU-seconds
    of their runs clipped to [period start, end), and how many ended in the period in
    each FINAL_STATE."""
    if not len(table.jobs):
        return
    t0, t_end = period.start.timestamp(), end.timestamp()
    units, started, ended = table.jobs[:, 0], table.jobs[:, 4], table.jobs[:, 5]
    runs = ~np.isnan(started) & (started < t_end) & (np.isnan(ended) | (ended > t0))
    run_end = np.minimum(np.where(np.isnan(ended), t_end, ended), t_end)
    overlap = np.maximum(0.0, run_end - np.maximum(started, t0))
    alloc_s = np.where(runs, units * np.nan_to_num(overlap), 0.0)
    ended_in = ~np.isnan(ended) & (ended >= t0) & (ended < period.end.timestamp())
    state = np.where(ended_in, table.ids[:, 4], -1).astype(np.int64)
    groups, group_of = _groups_of(
        np.nan_to_num(table.ids[:, GROUP_COLUMNS], nan=-1).astype(np.int64)
    )
    n = len(groups)
    alloc = np.bincount(group_of, weights=alloc_s, minlength=n)
    counts = [np.bincount(group_of[state == i], minlength=n) for i in range(len(FINAL_STATES))]

    def key(value: int) -> int | None:
        return None if value < 0 else int(value)

    for g, (queue, owner, node, gpu, project) in enumerate(groups.tolist()):
        yield (
            key(owner),
            key(queue),
            key(node),
            key(gpu),
            key(project),
            float(alloc[g]),
            [int(c[g]) for c in counts],
        )

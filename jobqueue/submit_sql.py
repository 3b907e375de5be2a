"""The reads of a submit as written SQL: each returns what its ORM query would, without
building and compiling that query again on every submit.

A submit runs about ten small queries. Through the ORM, building and compiling them was a
third of a submit's CPU (``python -m benchmarks.portal_submit --profile``), against a
fraction of a millisecond for PostgreSQL to answer them. The statements here are plain
SQL that PostgreSQL and SQLite both run; ``tests/jobqueue/test_submit_sql.py`` checks each
against the ORM query it stands for, on the same rows."""

from __future__ import annotations

from typing import Any

from django.db import connection

from accounts.models import Category, User
from cluster.models import Gpu, Node
from jobqueue.models import CategoryQueueAllowance, ContainerImage, Job, Queue


def _table(model: Any) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def _rows(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def open_queue(name: str) -> Queue | None:
    """The open queue of that name (names are unique)."""
    found = list(
        Queue.objects.raw(f"SELECT * FROM {_table(Queue)} WHERE name = %s AND is_active", [name])
    )
    return found[0] if found else None


def allowed_image(reference: str) -> ContainerImage | None:
    """The enabled image of that reference (references are unique)."""
    sql = f"SELECT * FROM {_table(ContainerImage)} WHERE reference = %s AND enabled"
    found = list(ContainerImage.objects.raw(sql, [reference]))
    return found[0] if found else None


def waiting_jobs(owner: User) -> int:
    """``Job.objects.filter(owner=owner).pending().count()``."""
    states = Job.WAITING_STATES
    sql = (
        f"SELECT COUNT(*) FROM {_table(Job)} WHERE owner_id = %s"
        f" AND state IN ({', '.join(['%s'] * len(states))})"
    )
    return int(_rows(sql, [owner.pk, *states])[0][0])


def weekly_allowance(category: Category, queue: Queue) -> CategoryQueueAllowance | None:
    """The category's allowance in the queue that sets a weekly GPU-hour limit, if any."""
    sql = (
        f"SELECT * FROM {_table(CategoryQueueAllowance)} WHERE category_id = %s AND queue_id = %s"
        " AND max_gpu_hours_per_week IS NOT NULL ORDER BY id"
    )
    found = list(CategoryQueueAllowance.objects.raw(sql, [category.pk, queue.pk]))
    return found[0] if found else None


def largest_node_capacity(
    *, shared_slot: bool, min_memory_mb: int, gpu_model: str, unknown_memory_fits: bool = False
) -> int:
    """The most matching GPU units any one node that takes work could ever give a job.

    ``unknown_memory_fits``: a GPU whose memory is unknown (0, a Slurm GRES no agent or
    admin has described) counts as large enough.
    """
    where = [
        "n.state IN (%s, %s)",
        "g.state <> %s",
    ]
    params: list[Any] = [Node.State.UP, Node.State.DRAINING, Gpu.State.MISSING]
    gpu = _table(Gpu)
    if shared_slot:
        where.append("g.kind = %s")
    else:
        where.append("g.kind <> %s")
        where.append(f"NOT EXISTS (SELECT 1 FROM {gpu} c WHERE c.parent_id = g.id)")
    params.append(Gpu.Kind.SLOT)
    if min_memory_mb:
        where.append(
            "(g.memory_mb >= %s OR g.memory_mb = 0)" if unknown_memory_fits else "g.memory_mb >= %s"
        )
        params.append(min_memory_mb)
    if gpu_model:
        # As the ORM's icontains: the text anywhere in the model, case aside, no wildcards.
        escaped = gpu_model.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        where.append("UPPER(g.model) LIKE UPPER(%s) ESCAPE '\\'")
        params.append(f"%{escaped}%")
    sql = (
        f"SELECT MAX(per_node.n) FROM (SELECT COUNT(*) AS n FROM {gpu} g"
        f" INNER JOIN {_table(Node)} n ON n.id = g.node_id WHERE {' AND '.join(where)}"
        " GROUP BY g.node_id) per_node"
    )
    return int(_rows(sql, params)[0][0] or 0)


def finished_runtimes(
    owner_id: int, *, excluding: int | None, limit: int
) -> list[tuple[str, str, int, float, int]]:
    """The owner's latest completed jobs, newest first: (image reference, command shape
    key, GPUs, seconds run, time limit in seconds)."""
    if connection.vendor == "postgresql":
        # date_part gives float8; EXTRACT gives numeric since PostgreSQL 14.
        ran = "date_part('epoch', j.ended_at - j.started_at)"
    else:  # SQLite keeps datetimes as text
        ran = "(julianday(j.ended_at) - julianday(j.started_at)) * 86400.0"
    where = (
        "j.owner_id = %s AND j.state = %s AND j.started_at IS NOT NULL AND j.ended_at IS NOT NULL"
    )
    params: list[Any] = [owner_id, Job.State.COMPLETED]
    if excluding is not None:
        where += " AND j.id <> %s"
        params.append(excluding)
    sql = (
        f"SELECT i.reference, j.command_shape_key, j.gpus, {ran}, j.time_limit_s"
        f" FROM {_table(Job)} j INNER JOIN {_table(ContainerImage)} i ON i.id = j.image_id"
        f" WHERE {where} ORDER BY j.ended_at DESC LIMIT %s"
    )
    return [(r[0], r[1], r[2], float(r[3]), r[4]) for r in _rows(sql, [*params, limit])]

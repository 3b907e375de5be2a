"""Job arrays: "0-9" or "1,4,7" (the syntax of ``labctl submit --array``, the API's and the
web form's), one job per index told its index in LABPORTAL_ARRAY_INDEX.

An array is checked once against the lab's rules (its tasks differ only in their index)
and its tasks are written in bulk, in one transaction: a constant number of statements
whatever its size, and one scheduling-pass request. Each task is a job like any other
(its own page, cancel, credits); the array's id is its first task's id."""

from __future__ import annotations

import copy
from typing import Any

from django.db import connection, transaction
from django.db.models.base import ModelState
from django.utils.translation import gettext as _

from accounts.models import User
from jobqueue import executor, services
from jobqueue.errors import JobRefused, NotJobOwner
from jobqueue.models import Job, JobEvent
from jobqueue.submit import CheckedJob, job_checked, submit_events

ARRAY_INDEX_ENV = "LABPORTAL_ARRAY_INDEX"
# The most tasks in one array (Slurm's MaxArraySize is 1001 by default: indices 0-1000).
MAX_ARRAY = 1000
# The largest index (Slurm's: MaxArraySize may be at most 4000001).
MAX_INDEX = 4_000_000


def array_indices(text: str) -> list[int]:
    """The indices of an array spec, each once and in order; ValueError says what to fix."""
    indices: list[int] = []
    for part in text.split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        low, high = low.strip(), high.strip()
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(
                _("“%(text)s” is not an array range: use 0-9, 1,4,7 or 0-3,10.") % {"text": text}
            )
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ValueError(
                _("“%(part)s” counts down; write it as %(last)d-%(first)d.")
                % {"part": part, "last": last, "first": first}
            )
        if len(indices) + last - first + 1 > MAX_ARRAY:
            raise ValueError(
                _("An array holds at most %(max)d jobs; “%(text)s” has more.")
                % {"max": MAX_ARRAY, "text": text}
            )
        if last > MAX_INDEX:
            raise ValueError(
                _("An array index is at most %(max)d; “%(part)s” goes past it.")
                % {"max": MAX_INDEX, "part": part}
            )
        indices.extend(range(first, last + 1))
    return list(dict.fromkeys(indices))


@transaction.atomic
def jobs_submit_array(*, owner: User, spec: dict[str, Any], indices: list[int]) -> list[Job]:
    """Queue one job per index of ``spec`` (``job_checked``'s arguments): all or none.

    The rules are checked once, with the owner's waiting-jobs and weekly GPU-hour limits
    counted for every task; a refusal queues nothing and says what to change."""
    if not indices:
        raise JobRefused(_("The array is empty: give at least one index, e.g. 0-9."))
    if len(indices) > MAX_ARRAY:
        raise JobRefused(
            _("An array holds at most %(max)d jobs; this one has %(n)d.")
            % {"max": MAX_ARRAY, "n": len(indices)}
        )
    checked = job_checked(owner=owner, count=len(indices), **spec)
    tasks = _tasks_like(checked.job, indices)
    # A task's events differ from the checked job's only in the job they belong to.
    events = submit_events(checked)
    if connection.vendor == "postgresql":
        _insert_copies_postgresql(checked, tasks, events)
    else:
        _insert_in_bulk(checked, tasks, events)
    queued = executor.current()
    if hasattr(queued, "jobs_queued"):
        # Agents: one pass request; Slurm: one sbatch --array.
        queued.jobs_queued(tasks)
    else:  # a lab's own executor from before arrays were sent together
        for task in tasks:
            queued.job_queued(task)
    return tasks


# What differs from task to task; every other column is the checked job's.
_PER_TASK = ("id", "array_id", "array_index", "env", "name")


def _tasks_like(model: Job, indices: list[int]) -> list[Job]:
    """One unsaved copy of ``model`` per index, told its index (a copy, not a Model():
    the fields are already clean, and building 1,000 jobs field by field is most of an
    array's Python time)."""
    values, fields, loaded = model.__dict__, model._state.fields_cache, model._state.db
    name = model.name
    tasks = []
    for index in indices:
        # As unpickling does: the values copied, its own state; the owner, queue and
        # image (and any other object the check loaded) shared.
        task = Job.__new__(Job)
        task.__dict__.update(values)
        task._state = ModelState()
        task._state.db, task._state.fields_cache = loaded, dict(fields)
        task.env = {**model.env, ARRAY_INDEX_ENV: str(index)}
        task.name = f"{name}[{index}]"[:120] if name else ""
        task.array_index = index
        tasks.append(task)
    return tasks


def _insert_in_bulk(checked: CheckedJob, tasks: list[Job], events: list[JobEvent]) -> None:
    """Write the tasks, their events and their mounts and dependencies with one INSERT a
    table (a few where the database caps a statement's parameters), and number the array."""
    Job.objects.bulk_create(tasks)
    array_id = tasks[0].pk
    Job.objects.filter(pk__in=[t.pk for t in tasks]).update(array_id=array_id)
    copies = []
    for task in tasks:
        task.array_id = array_id
        for event in events:
            copies.append(copy.copy(event))
            copies[-1].job = task
    JobEvent.objects.bulk_create(copies)
    if checked.mounts:
        through = Job.mounts.through
        through.objects.bulk_create(
            [through(job_id=t.pk, volumemount_id=m.pk) for t in tasks for m in checked.mounts]
        )
    if checked.dependencies:
        waits = Job.depends_on.through
        waits.objects.bulk_create(
            [waits(from_job_id=t.pk, to_job_id=d.pk) for t in tasks for d in checked.dependencies]
        )


def _insert_copies_postgresql(
    checked: CheckedJob, tasks: list[Job], events: list[JobEvent]
) -> None:
    """Write the tasks, their events and their mounts and dependencies in one statement
    that PostgreSQL expands: the checked job's values go once, with the list of indices,
    so the parameters do not grow with the array (converting each task's 45 values in
    Python took longer than PostgreSQL's writing them)."""
    model, quote = checked.job, connection.ops.quote_name
    # Each task's id from the table's sequence, in the order of the indices.
    ids = (
        "task AS MATERIALIZED (SELECT nextval(pg_get_serial_sequence(%s, 'id')) AS id, t.i, t.n"
        " FROM unnest(%s::integer[]) WITH ORDINALITY AS t(i, n))"
    )
    params: list[Any] = [Job._meta.db_table, [t.array_index for t in tasks]]
    env_sql = "%s::jsonb || jsonb_build_object(%s::text, task.i::text)"
    params += [Job._meta.get_field("env").get_db_prep_save(model.env, connection), ARRAY_INDEX_ENV]
    name_sql = "''"
    if model.name:
        name_sql = "left(%s || '[' || task.i || ']', 120)"
        params.append(model.name)
    same = [f for f in Job._meta.concrete_fields if f.attname not in _PER_TASK and not f.generated]
    params += [_value(f, model) for f in same]
    statements = [
        ids,
        f"job AS (INSERT INTO {quote(Job._meta.db_table)} "
        f"({', '.join(quote(c) for c in _PER_TASK)}, {_columns(same)}) "
        f"SELECT task.id, (SELECT id FROM task WHERE n = 1), task.i, {env_sql}, {name_sql}, "
        f"{', '.join(_cast(f) for f in same)} FROM task ORDER BY task.n)",
    ]
    if events:
        fields = [f for f in JobEvent._meta.concrete_fields if f.attname not in ("id", "job_id")]
        rows = ", ".join(
            f"({place}, {', '.join(_cast(f) for f in fields)})" for place in range(len(events))
        )
        params += [_value(f, event) for event in events for f in fields]
        statements.append(
            f"event AS (INSERT INTO {quote(JobEvent._meta.db_table)} (job_id, {_columns(fields)}) "
            f"SELECT task.id, {', '.join('e.' + quote(f.column) for f in fields)} "
            f"FROM task, (VALUES {rows}) AS e(place, {_columns(fields)}) "
            "ORDER BY task.n, e.place)"
        )
    relations: list[tuple[Any, list[Any]]] = [
        (Job.mounts, checked.mounts),
        (Job.depends_on, checked.dependencies),
    ]
    for place, (related, targets) in enumerate(relations):
        if targets:
            through = related.through._meta
            own = through.get_field(related.field.m2m_field_name()).column
            other = through.get_field(related.field.m2m_reverse_field_name()).column
            statements.append(
                f"m2m{place} AS (INSERT INTO {quote(through.db_table)} "
                f"({quote(own)}, {quote(other)}) SELECT task.id, target "
                "FROM task, unnest(%s::bigint[]) AS target ORDER BY task.n)"
            )
            params.append([t.pk for t in targets])
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {', '.join(statements)} SELECT id FROM task ORDER BY n", params)
        pks = [row[0] for row in cursor.fetchall()]
    for task, pk in zip(tasks, pks, strict=True):
        task.pk, task.array_id = pk, pks[0]
        task._state.adding, task._state.db = False, connection.alias


def _columns(fields: list[Any]) -> str:
    return ", ".join(connection.ops.quote_name(f.column) for f in fields)


def _value(field: Any, obj: Any) -> Any:
    """A field's value as Django's own INSERT sends it."""
    return field.get_db_prep_save(field.pre_save(obj, add=True), connection)


def _cast(field: Any) -> str:
    # Typed like Django's own bulk insert on PostgreSQL: a bare NULL in a SELECT is text.
    return "%s::" + field.db_type(connection).split("(")[0]


@transaction.atomic
def array_cancel(*, job: Job, actor: User) -> list[int]:
    """Cancel every job of ``job``'s array that has not ended (each as ``job_cancel`` does,
    together: one lock of the tasks, and the executor's ``jobs_cancel``); their ids."""
    if job.array_id is None:
        raise JobRefused(
            _("Job %(id)d is not part of an array; cancel it on its own.") % {"id": job.pk}
        )
    if job.owner_id != actor.pk and not actor.is_staff:
        raise NotJobOwner(_("Only the job's owner or an admin can cancel it."))
    tasks = list(
        Job.objects.select_for_update()
        .only("id", "state", "owner_id")  # the executor loads the rest of a job it stops
        .filter(array_id=job.array_id)
        .exclude(state__in=Job.FINAL_STATES)
        .order_by("pk")
    )
    cancelling = executor.current()
    if hasattr(cancelling, "jobs_cancel"):
        cancelling.jobs_cancel(tasks, actor=actor)
    else:  # a lab's own executor from before arrays were cancelled together
        for task in tasks:
            cancelling.job_cancel(services.job_locked(task.pk), actor=actor)
    return [task.pk for task in tasks]

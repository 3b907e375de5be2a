"""Job arrays: "0-9" or "1,4,7" (the syntax of ``labctl submit --array``, the API's and the
web form's), one job per index told its index in LABPORTAL_ARRAY_INDEX.

An array is checked once against the lab's rules (its tasks differ only in their index)
and its tasks are written in bulk, in one transaction: a constant number of statements
whatever its size, and one scheduling-pass request. Each task is a job like any other
(its own page, cancel, credits); the array's id is its first task's id."""

from __future__ import annotations

import dataclasses
from typing import Any

from django.db import transaction
from django.utils.translation import gettext as _

from accounts.models import User
from jobqueue import executor, services
from jobqueue.errors import JobRefused, NotJobOwner
from jobqueue.models import Job, JobEvent
from jobqueue.submit import job_checked, submit_events

ARRAY_INDEX_ENV = "LABPORTAL_ARRAY_INDEX"
# The most tasks in one array (Slurm's MaxArraySize is 1001 by default: indices 0-1000).
MAX_ARRAY = 1000


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
    model = checked.job
    name = model.name
    tasks = []
    for index in indices:
        task = Job(**{f.attname: getattr(model, f.attname) for f in Job._meta.concrete_fields})
        task.pk = None
        # The objects the check loaded, not their ids alone: the events read them.
        task.owner, task.queue, task.image = model.owner, model.queue, model.image
        task.env = {**model.env, ARRAY_INDEX_ENV: str(index)}
        task.name = f"{name}[{index}]"[:120] if name else ""
        task.array_index = index
        tasks.append(task)
    Job.objects.bulk_create(tasks)
    array_id = tasks[0].pk
    Job.objects.filter(pk__in=[t.pk for t in tasks]).update(array_id=array_id)
    events: list[JobEvent] = []
    for task in tasks:
        task.array_id = array_id
        events.extend(submit_events(dataclasses.replace(checked, job=task)))
    JobEvent.objects.bulk_create(events)
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
    queued = executor.current()
    for task in tasks:
        # Agents: a pass request, asked once per transaction; Slurm: its sbatch.
        queued.job_queued(task)
    return tasks


@transaction.atomic
def array_cancel(*, job: Job, actor: User) -> list[Job]:
    """Cancel every job of ``job``'s array that has not ended (each as ``job_cancel`` does)."""
    if job.array_id is None:
        raise JobRefused(
            _("Job %(id)d is not part of an array; cancel it on its own.") % {"id": job.pk}
        )
    if job.owner_id != actor.pk and not actor.is_staff:
        raise NotJobOwner(_("Only the job's owner or an admin can cancel it."))
    waiting = (
        Job.objects.filter(array_id=job.array_id)
        .exclude(state__in=Job.FINAL_STATES)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    return [services.job_cancel(job_id=pk, actor=actor) for pk in list(waiting)]

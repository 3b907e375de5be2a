"""Submitting jobs: the command, environment, mounts, queue, grant, booking and limits
checked against the lab's rules, the job saved with its predicted run time, and handed
to the executor (``jobqueue.executor.current().job_queued``)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop, ngettext

from accounts.models import Category, Project, User
from core.durations import hours_minutes
from core.errors import DomainError
from core.i18n import join_sentences
from jobqueue import executor, submit_sql
from jobqueue.dependencies import AFTEROK, dependencies_for_submit
from jobqueue.errors import (
    GrantRequired,
    ImageNotAllowed,
    JobRefused,
    MountNotAllowed,
    QueueNotFound,
    QuotaExceeded,
    ReservationNotUsable,
    TimeLimitTooLong,
    TooManyGpus,
)
from jobqueue.events import event_for
from jobqueue.models import (
    SHELL_PREFIX,
    Allocation,
    ContainerImage,
    Job,
    JobEvent,
    PriorityGrant,
    Queue,
    VolumeMount,
    command_limit_refusal,
    env_limit_refusal,
)
from jobqueue.prediction import job_predict_runtime

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_ENV = {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "LABPORTAL_JOB_ID"}


def _parse_command(command: str | Iterable[str]) -> list[str]:
    """A string is shell text, run as typed through `/bin/sh -c`; a list is an exec vector."""
    if not isinstance(command, str):
        command = list(command)
    refusal = command_limit_refusal(command)
    if refusal is not None:
        raise JobRefused(refusal)
    if isinstance(command, str):
        if not command.strip():
            raise JobRefused(
                _("The command is empty. Give the program to run, e.g. python train.py.")
            )
        try:
            # The shell would refuse unbalanced quotes only once the job runs; say so now
            # (a quote in a script's # comment is no quote to the shell).
            shlex.split(command, comments=True)
        except ValueError as exc:
            raise JobRefused(
                _("The command could not be parsed (%(error)s). Check its quotes.") % {"error": exc}
            ) from None
        return [*SHELL_PREFIX, command.strip()]
    argv = [str(part) for part in command]
    if not argv or not argv[0].strip():
        raise JobRefused(_("The command is empty. Give the program to run, e.g. python train.py."))
    if any("\x00" in part for part in argv):
        # No process argument can hold one, and PostgreSQL cannot store it.
        raise JobRefused(_("The command contains a NUL character (\\0); remove it."))
    return argv


def _clean_env(env: Mapping[str, Any] | None) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise JobRefused(_("The environment must be a list of NAME=value pairs."))
    refusal = env_limit_refusal(dict(env))
    if refusal is not None:
        raise JobRefused(refusal)
    cleaned: dict[str, str] = {}
    for name, value in env.items():
        if not ENV_NAME.match(str(name)):
            raise JobRefused(
                _(
                    "“%(name)s” is not a valid environment variable name: use letters, digits and _, not starting with a digit."
                )
                % {"name": name}
            )
        if name in RESERVED_ENV:
            raise JobRefused(
                _("%(name)s is set by LabPortal to the job's GPUs; remove it from the environment.")
                % {"name": name}
            )
        cleaned[str(name)] = str(value)
    return cleaned


@dataclass
class CheckedJob:
    """A job that passed the lab's rules, not saved yet, and what goes with it."""

    job: Job
    mounts: list[VolumeMount]
    dependencies: list[Job]
    memory_unchecked: bool


@transaction.atomic
def job_submit(*, owner: User, **spec: Any) -> Job:
    """Validate a job against the lab's rules and queue it; every refusal says what to change.

    ``spec``: ``job_checked``'s arguments."""
    checked = job_checked(owner=owner, **spec)
    job = checked.job
    job.save()
    if checked.mounts:
        job.mounts.set(checked.mounts)
    if checked.dependencies:
        job.depends_on.set(checked.dependencies)
    for event in submit_events(checked):
        event.save(force_insert=True)
    executor.current().job_queued(job)
    _answer_without_asking(job, checked)
    return job


def submit_events(checked: CheckedJob) -> list[JobEvent]:
    """The events of a submit, not saved: "submitted", and what was not checked."""
    job = checked.job
    events = [
        event_for(
            job,
            "submitted",
            gettext_noop("Submitted to the %(queue)s queue."),
            params={"queue": job.queue.name},
            actor=job.owner,
        )
    ]
    if checked.memory_unchecked:
        events.append(
            event_for(
                job,
                "gpu_memory_unchecked",
                gettext_noop(
                    "LabPortal does not know the memory of the Slurm nodes' GPUs, so the minimum of %(mem)d MiB per GPU was not checked: Slurm places the job."
                ),
                params={"mem": job.min_gpu_memory_mb},
            )
        )
    return events


def _answer_without_asking(job: Job, checked: CheckedJob) -> None:
    # A new job has no GPUs yet and only the mounts just set: whoever shows it
    # (the API's answer) need not ask the database again.
    job._prefetched_objects_cache = {  # type: ignore[attr-defined]
        "allocations": Allocation.objects.none(),
        **({} if checked.mounts else {"mounts": VolumeMount.objects.none()}),
        **({} if checked.dependencies else {"depends_on": Job.objects.none()}),
    }
    # Nor for its Slurm row: the Slurm executor has just made it (and Django cached
    # it on the job); in agents mode there is none.
    slurm_row = Job.slurm.related
    if not slurm_row.is_cached(job):
        slurm_row.set_cached_value(job, None)


def job_checked(
    *,
    owner: User,
    queue: str | Queue,
    image: str,
    command: str | Iterable[str],
    gpus: int = 1,
    shared_slot: bool = False,
    env: Mapping[str, Any] | None = None,
    mounts: Iterable[str] = (),
    time_limit_s: int | None = None,
    min_gpu_memory_mb: int = 0,
    gpu_model: str = "",
    cpus: Decimal | float | int = Decimal("4"),
    memory_mb: int = 16384,
    name: str = "",
    reservation_id: int | None = None,
    preemptible: bool = False,
    depends_on: Iterable[int] = (),
    dependency: str = AFTEROK,
    kind: str = Job.Kind.BATCH,
    count: int = 1,
    project: str = "",
) -> CheckedJob:
    """Check a job against the lab's rules (the caller holds a transaction); every refusal
    says what to change. ``count``: the job stands for so many alike (an array's tasks),
    counted together against the owner's waiting jobs and weekly GPU-hours.

    ``depends_on``: earlier jobs of the owner's (staff: anyone's) that it waits for, as
    Slurm's ``dependency`` kind says: ``afterok`` (each completed) or ``afterany``.
    ``kind``: an interactive session's (``sessions.services.session_start`` builds its command).
    ``project``: the short name of a project of the owner's to charge the GPU time to."""
    if kind not in Job.Kind.values:
        raise JobRefused(
            _("A job's kind is one of %(kinds)s.") % {"kinds": ", ".join(Job.Kind.values)}
        )
    owner.lock_for_limits()
    queue_obj = _queue_for_submit(queue)
    image_obj = submit_sql.allowed_image(image)
    if image_obj is None:
        allowed = ", ".join(
            ContainerImage.objects.filter(enabled=True).values_list("reference", flat=True)[:10]
        )
        raise ImageNotAllowed(
            _(
                "The image “%(image)s” is not on the lab's allowlist. Use one of: %(allowed)s — or ask an admin to add it."
            )
            % {"image": image, "allowed": allowed or _("(none yet)")}
        )
    argv = _parse_command(command)
    clean_env = _clean_env(env)
    gpus = int(gpus)
    if shared_slot:
        if not executor.current().portal_schedules:
            raise JobRefused(
                _(
                    "Slurm gives each job whole GPUs here, so there are no shared GPU slots: "
                    "ask for 1 GPU without a shared slot."
                )
            )
        if not queue_obj.allows_shared_slots:
            raise JobRefused(
                _(
                    "The %(queue)s queue does not use shared GPU slots; submit to the debug queue or ask for whole GPUs."
                )
                % {"queue": queue_obj.name}
            )
        gpus = 1
    if preemptible and not executor.current().portal_schedules:
        raise JobRefused(
            _(
                "Slurm here does not preempt jobs, so a preemptible job would run as any "
                "other at the full rate: submit it without preemptible."
            )
        )
    if gpus < 1:
        raise JobRefused(_("A job needs at least one GPU."))
    if gpus > queue_obj.max_gpus_per_job:
        raise TooManyGpus(
            ngettext(
                "The %(queue)s queue allows at most %(max)d GPU per job; ask for fewer.",
                "The %(queue)s queue allows at most %(max)d GPUs per job; ask for fewer.",
                queue_obj.max_gpus_per_job,
            )
            % {"queue": queue_obj.name, "max": queue_obj.max_gpus_per_job}
        )
    category = owner.category
    if category is not None and gpus > category.max_concurrent_gpus:
        raise TooManyGpus(
            ngettext(
                "Your category (%(category)s) may use at most %(max)d GPU at once; ask for fewer.",
                "Your category (%(category)s) may use at most %(max)d GPUs at once; ask for fewer.",
                category.max_concurrent_gpus,
            )
            % {"category": category.local_name, "max": category.max_concurrent_gpus}
        )
    # In Slurm mode Slurm places the job: a GPU of unknown memory is not a reason to refuse.
    slurm_places = min_gpu_memory_mb > 0 and not executor.portal_schedules()
    capacity = submit_sql.largest_node_capacity(
        shared_slot=shared_slot,
        min_memory_mb=min_gpu_memory_mb,
        gpu_model=gpu_model,
        unknown_memory_fits=slurm_places,
    )
    memory_unchecked = slurm_places and (
        submit_sql.largest_node_capacity(
            shared_slot=shared_slot, min_memory_mb=min_gpu_memory_mb, gpu_model=gpu_model
        )
        < gpus
    )
    if gpus > capacity:
        if capacity == 0:
            raise TooManyGpus(
                _(
                    "No GPU in the lab matches this request (model “%(model)s”, at least %(mem)d MiB%(slot)s). Relax the constraints."
                )
                % {
                    "model": gpu_model or _("any"),
                    "mem": min_gpu_memory_mb,
                    "slot": _(", shared slot") if shared_slot else "",
                }
            )
        raise TooManyGpus(
            _(
                "No node has %(gpus)d matching GPUs; the largest has %(capacity)d. A job's GPUs must be on one node, so ask for at most %(capacity)d."
            )
            % {"gpus": gpus, "capacity": capacity}
        )
    limit = int(time_limit_s) if time_limit_s else queue_obj.default_time_limit_s
    if limit <= 0:
        raise JobRefused(_("The time limit must be positive."))
    if limit > queue_obj.max_time_limit_s:
        raise TimeLimitTooLong(
            _(
                "The %(queue)s queue allows a time limit of at most %(max)s; ask for less, or use another queue."
            )
            % {"queue": queue_obj.name, "max": hours_minutes(queue_obj.max_time_limit_s)}
        )
    if category is not None:
        waiting = submit_sql.waiting_jobs(owner)
        if count > 1 and waiting + count > category.max_queued_jobs:
            # count > 1: an array's refusal (always "jobs"), the waiting ones as a figure.
            raise QuotaExceeded(
                _(
                    "This array of %(count)d jobs would take you past the %(max)d waiting jobs your category allows (waiting now: %(n)d). Submit a smaller array, or cancel waiting jobs."
                )
                % {"count": count, "max": category.max_queued_jobs, "n": waiting}
            )
        if waiting >= category.max_queued_jobs:
            raise QuotaExceeded(
                ngettext(
                    "You have %(n)d job waiting, the most your category allows. Cancel it or wait for it to start.",
                    "You have %(n)d jobs waiting, the most your category allows. Cancel some or wait for them to start.",
                    waiting,
                )
                % {"n": waiting}
            )
    if queue_obj.requires_grant and not _has_grant(owner, queue_obj):
        raise GrantRequired(
            _(
                "The %(queue)s queue needs an approved priority grant. Apply for one (reason and deadline), or submit to the normal queue."
            )
            % {"queue": queue_obj.name}
        )
    if category is not None:
        _check_weekly_allowance(owner, category, queue_obj, gpus * limit * count)
    mount_objs = _mounts_for(owner, mounts)
    reservation = _reservation_for(owner, reservation_id, gpus) if reservation_id else None
    try:
        cpus_value = Decimal(str(cpus))
    except ArithmeticError:
        raise JobRefused(_("CPUs must be a number, e.g. 4 or 0.5.")) from None
    if cpus_value <= 0 or memory_mb <= 0:
        raise JobRefused(_("CPUs and memory must be positive."))
    dependencies = dependencies_for_submit(owner, depends_on, dependency)
    project_obj = project_for_submit(owner, project) if project else None

    job = Job(
        owner=owner,
        queue=queue_obj,
        name=name[:120],
        kind=kind,
        image=image_obj,
        command=argv,
        env=clean_env,
        gpus=gpus,
        shared_slot=shared_slot,
        min_gpu_memory_mb=min_gpu_memory_mb,
        gpu_model=gpu_model,
        cpus=cpus_value,
        memory_mb=memory_mb,
        time_limit_s=limit,
        preemptible=preemptible,
        reservation=reservation,
        project=project_obj,
        dependency_kind=dependency if dependencies else "",
        state=Job.State.PENDING,
        # No reason until the first pass has placed it: pages say "being scheduled".
        pending_reason="",
    )
    job.shape_command()
    job.predicted_runtime_s = job_predict_runtime(job)
    return CheckedJob(job, mount_objs, list(dependencies), memory_unchecked)


def project_for_submit(owner: User, name: str) -> Project:
    """The active project `name` if `owner` may charge jobs to it; else a refusal that
    names the projects they may use."""
    found = Project.objects.filter(name=name.strip()).first()
    if found is not None and found.is_open_to(owner):
        return found
    mine = ", ".join(Project.objects.open_to(owner).values_list("name", flat=True)[:20])
    if found is not None and not found.active:
        reason = _("The project “%(project)s” has ended and takes no new jobs.") % {
            "project": found.name
        }
    elif found is not None:
        reason = _(
            "You are not a member of the project “%(project)s”: ask its PI or a lab admin to "
            "add you."
        ) % {"project": found.name}
    else:
        reason = _("There is no project “%(project)s”.") % {"project": name.strip()[:40]}
    if mine:
        hint = _("Your projects: %(projects)s.") % {"projects": mine}
    else:
        hint = _("You belong to no project: leave the project empty.")
    raise JobRefused(join_sentences([reason, hint]))


MAX_BATCH = 500
BATCH_TOO_LARGE = gettext_noop("A batch holds at most %(max)d jobs; split it into smaller batches.")


@transaction.atomic
def jobs_submit_batch(*, owner: User, specs: list[dict[str, Any]]) -> list[Job]:
    """Submit many jobs at once (like a Slurm job array): all are queued, or none is.

    A refusal names the job it is about (its place in the batch) and says what to change.
    """
    if not specs:
        raise JobRefused(_("The batch is empty: send at least one job."))
    if len(specs) > MAX_BATCH:
        raise JobRefused(_(BATCH_TOO_LARGE) % {"max": MAX_BATCH})
    jobs = []
    # One transaction holds the whole batch and any refusal rolls it all back, so
    # each job needs no savepoint of its own (two statements fewer per job).
    submit_one = job_submit.__wrapped__  # type: ignore[attr-defined]
    for place, spec in enumerate(specs, start=1):
        try:
            jobs.append(submit_one(owner=owner, **spec))
        except DomainError as exc:
            refusal = type(exc)(
                _("Job %(place)d of %(count)d: %(reason)s")
                % {"place": place, "count": len(specs), "reason": exc.message}
            )
            raise refusal from exc
    return jobs


def _queue_for_submit(queue: str | Queue) -> Queue:
    if isinstance(queue, Queue):
        return queue
    queue_obj = submit_sql.open_queue(queue)
    if queue_obj is None:
        names = ", ".join(Queue.objects.filter(is_active=True).values_list("name", flat=True))
        raise QueueNotFound(
            _("There is no open queue called “%(queue)s”. Choose one of: %(names)s.")
            % {"queue": queue, "names": names}
        )
    return queue_obj


ALLOWANCE_WINDOW = timedelta(days=7)


def _check_weekly_allowance(
    owner: User, category: Category, queue_obj: Queue, asked_gpu_s: float
) -> None:
    """Refuse a job that would take the owner over their category's GPU-hours a week in
    the queue (``CategoryQueueAllowance``); no allowance, no weekly limit."""
    allowance = submit_sql.weekly_allowance(category, queue_obj)
    if allowance is None or allowance.max_gpu_hours_per_week is None:
        return
    now = timezone.now()
    used = Job.objects.filter(
        owner=owner, queue=queue_obj, submitted_at__gte=now - ALLOWANCE_WINDOW
    ).gpu_hours_asked(now=now)
    asked = asked_gpu_s / 3600
    cap = allowance.max_gpu_hours_per_week
    if used + asked > cap:
        raise QuotaExceeded(
            _(
                "This job asks for %(asked)s GPU-hours (GPUs × time limit); your jobs in the %(queue)s queue already took %(used)s of your category's %(cap)d GPU-hours over the last 7 days. Ask for fewer GPUs or a shorter time limit, or use another queue."
            )
            % {
                "asked": f"{asked:.1f}",
                "queue": queue_obj.name,
                "used": f"{used:.1f}",
                "cap": cap,
            }
        )


def _has_grant(owner: User, queue: Queue) -> bool:
    return PriorityGrant.objects.in_force().filter(user=owner, queue=queue).exists()


def _mounts_for(owner: User, names: Iterable[str]) -> list[VolumeMount]:
    wanted = [n for n in dict.fromkeys(names) if n]
    if not wanted:
        return []
    found = {m.name: m for m in VolumeMount.objects.filter(name__in=wanted, enabled=True)}
    missing = [n for n in wanted if n not in found]
    if missing:
        allowed = ", ".join(VolumeMount.objects.filter(enabled=True).values_list("name", flat=True))
        raise MountNotAllowed(
            _("These mounts are not on the lab's allowlist: %(missing)s. Allowed: %(allowed)s.")
            % {"missing": ", ".join(missing), "allowed": allowed or _("(none)")}
        )
    for mount in found.values():
        try:
            mount.source_for(owner.username)
        except ValueError:
            raise MountNotAllowed(
                _("The mount %(name)s cannot be used with your user name; ask an admin.")
                % {"name": mount.name}
            ) from None
    return [found[n] for n in wanted]


def _reservation_for(owner: User, reservation_id: int, gpus: int) -> Any:
    reservation = Job.reservation_model().objects.live().filter(pk=reservation_id).first()
    if reservation is None or reservation.user_id != owner.pk:
        raise ReservationNotUsable(
            _(
                "Reservation %(id)s is not one of your current bookings. Pick one from My reservations."
            )
            % {"id": reservation_id}
        )
    if reservation.end <= timezone.now():
        raise ReservationNotUsable(_("That reservation has already ended."))
    booked = reservation.gpus.count()
    if gpus > booked:
        raise ReservationNotUsable(
            ngettext(
                "The reservation holds %(booked)d GPU; ask for at most that many.",
                "The reservation holds %(booked)d GPUs; ask for at most that many.",
                booked,
            )
            % {"booked": booked}
        )
    return reservation

"""Slurm mode's workflows: submit as the member, cancel, and reconcile with what Slurm reports."""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from accounts.models import CreditAccount
from cluster.models import Gpu, Node
from joblogs.models import JobLog
from joblogs.services import job_log_append
from jobqueue.arrays import ARRAY_INDEX_ENV
from jobqueue.errors import JobRefused
from jobqueue.executor import OutsideLiveJob
from jobqueue.models import Job, JobEvent
from protocol.messages import MAX_LOG_CHUNK_BYTES
from sessions.launch import TOKEN_ENV, session_token
from slurm.cli import (
    JobInfo,
    NodeInfo,
    PartitionInfo,
    SlurmClient,
    SlurmError,
    SlurmSetupError,
    SlurmUnavailable,
    SubmitRequest,
    array_task_indices,
    client_from_settings,
    member_call,
    slurm_unreachable_since,
)
from slurm.models import Partition, QueueMapping, SlurmArray, SlurmJob, UnixLogin
from slurm.policy import grant_qos_names, member_account, top_qos_name
from slurm.setup_check import close_host_problems

if TYPE_CHECKING:
    from accounts.models import User

log = logging.getLogger(__name__)


class UnixLoginMissing(JobRefused):
    code = "unix_login_missing"


class SlurmRefused(JobRefused):
    code = "slurm_refused"


class SlurmDown(JobRefused):
    code = "slurm_unavailable"
    status_code = 503


class SlurmNotSetUp(JobRefused):
    """The portal host cannot run Slurm's commands as the member: the admins' to fix."""

    code = "slurm_setup"
    status_code = 503


# -- submission ------------------------------------------------------------------------


def unix_user_for(user: User) -> str:
    """The unix user the member's jobs run as; a clear refusal when staff has not set one."""
    login = UnixLogin.objects.filter(user=user).first()
    if login is None:
        raise UnixLoginMissing(
            _(
                "Your account has no unix user name on the Slurm cluster yet, so the portal cannot submit as you. Ask a lab admin to set it (admin site → Unix logins)."
            )
        )
    return login.username


def batch_script(job: Job, *, container: str) -> str:
    """The job's batch script: its command, in its image through the site's container plugin."""
    command = shlex.join(job.command)
    mounts = [(m.source_for(job.owner.username), m.target, m.read_only) for m in job.mounts.all()]
    image = job.image.reference
    if container == "pyxis":
        options = [f"--container-image={image}"]
        if mounts:
            options.append(
                "--container-mounts="
                + ",".join(f"{src}:{dst}{':ro' if ro else ''}" for src, dst, ro in mounts)
            )
        run = f"srun {shlex.join(options)} {command}"
    elif container == "apptainer":
        binds = [f"--bind={src}:{dst}{':ro' if ro else ''}" for src, dst, ro in mounts]
        run = shlex.join(["apptainer", "exec", "--nv", *binds, f"docker://{image}"]) + " " + command
    else:
        run = command
    prelude = SESSION_PRELUDE if job.kind == Job.Kind.JUPYTER else ""
    return f"#!/bin/bash\n# LabPortal job {job.pk} ({image})\n{prelude}{run}\n"


# A JupyterLab session as a batch job, as Open OnDemand's interactive apps run: the script
# takes a free port on its node, prints where the server will listen as the first line
# of its output (the portal reads it from the output file, `slurm_session_server`), and
# the server listens on every address of the node, its token required on each request.
SESSION_MARKER = "LABPORTAL-SESSION"
SESSION_PRELUDE = (
    "export LABPORTAL_SESSION_HOST=0.0.0.0\n"
    "export LABPORTAL_SESSION_PORT=\"$(python3 -c 'import socket; s = socket.socket(); "
    's.bind(("", 0)); print(s.getsockname()[1])\')"\n'
    f'echo "{SESSION_MARKER} host=${{LABPORTAL_SESSION_ADDRESS:-$(hostname)}} '
    'port=$LABPORTAL_SESSION_PORT"\n'
)
_SESSION_LINE = re.compile(rf"^{SESSION_MARKER} host=([A-Za-z0-9.:_-]+) port=(\d{{1,5}})$", re.M)


def _session_env(job: Job) -> dict[str, str]:
    """A session's secret token (never stored, never shown: the proxy adds it)."""
    if job.kind != Job.Kind.JUPYTER:
        return {}
    return {TOKEN_ENV: session_token(job_id=job.pk, attempt=job.dispatch_count)}


def slurm_session_server(*, job: Job) -> str | None:
    """``http://host:port`` of a running session's server, from the first line its batch
    script printed; None before it printed it (or for a job that is no session)."""
    if job.kind != Job.Kind.JUPYTER or job.state != Job.State.RUNNING:
        return None
    record = SlurmJob.objects.filter(job=job).first()
    if record is None or not record.output_path:
        return None
    try:
        with open(record.output_path, "rb") as handle:
            head = handle.read(4096).decode("utf-8", "replace")
    except OSError:
        return None
    found = _SESSION_LINE.search(head)
    if found is None or not 0 < int(found.group(2)) < 65536:
        return None
    return f"http://{found.group(1)}:{int(found.group(2))}"


def slurm_gpu_type(model: str, slurm_types: Iterable[str]) -> str:
    """The GRES type for the GPU model a member picked ("" for any), or a refusal.

    The admin's LABPORTAL_SLURM_GPU_TYPES maps a portal model name to its GRES type;
    otherwise a model that is a GRES type on the cluster (the names the inventory shows,
    any case) is itself the type. A model Slurm has no GPU of is refused at submit."""
    if not model:
        return ""
    types = {t.lower(): t for t in slurm_types}
    mapped = settings.LABPORTAL_SLURM_GPU_TYPES.get(model.strip().lower(), model.strip())
    if mapped.lower() in types:
        return types[mapped.lower()]
    raise SlurmRefused(
        _(
            "The Slurm cluster has no GPU of model “%(model)s” (its GPU types: %(types)s). Pick one of those, or leave the model empty for any GPU."
        )
        % {"model": model[:120], "types": ", ".join(sorted(types.values())) or _("none")}
    )


def submit_request(
    job: Job, *, unix_user: str, gpu_type: str = "", account: str = ""
) -> SubmitRequest:
    mapping = QueueMapping.objects.filter(queue=job.queue).first()
    options = mapping.sbatch_options() if mapping else {"qos": job.queue.name}
    output_dir = Path(settings.LABPORTAL_SLURM_OUTPUT_DIR)
    return SubmitRequest(
        unix_user=unix_user,
        script=batch_script(job, container=settings.LABPORTAL_SLURM_CONTAINER),
        name=(job.name or f"labportal-{job.pk}")[:100],
        output_path=str(output_dir / f"labportal-{job.pk}-%j.out"),
        workdir=str(output_dir),
        time_limit_s=job.time_limit_s,
        gpus=job.gpus,
        gpu_type=gpu_type,
        cpus=max(1, int(-(-job.cpus // 1))),
        memory_mb=job.memory_mb,
        partition=options.get("partition", ""),
        qos=options.get("qos", ""),
        account=account,
        # The project as Slurm's wckey: sacct and sreport show the GPU time per project.
        wckey=job.project.name if job.project is not None else "",
        environment={**job.env, "LABPORTAL_JOB_ID": str(job.pk), **_session_env(job)},
        dependency=slurm_dependency(job),
    )


def slurm_dependency(job: Job) -> str:
    """The job's dependencies over their Slurm job ids ("afterok:101:102"), or "".

    A portal job it waits for that Slurm does not know yet (no Slurm id) is refused."""
    wanted = sorted(job.depends_on.values_list("pk", flat=True))
    if not wanted:
        return ""
    slurm_ids: dict[int, int | str] = dict(
        SlurmJob.objects.filter(job_id__in=wanted).values_list("job_id", "slurm_job_id")
    )
    # A task still waiting in its array: Slurm waits for it by its task id ("41_3").
    tasks = Job.objects.filter(pk__in=[pk for pk in wanted if pk not in slurm_ids])
    arrays = {
        a.portal_array_id: a
        for a in SlurmArray.objects.filter(
            portal_array_id__in=tasks.exclude(array_id=None).values("array_id")
        )
    }
    for pk, array_id, index in tasks.values_list("pk", "array_id", "array_index"):
        if array_id in arrays:
            slurm_ids[pk] = arrays[array_id].task_spec(int(index or 0))
    missing = [pk for pk in wanted if pk not in slurm_ids]
    if missing:
        raise JobRefused(
            _(
                "Job %(ids)s has no Slurm job id yet, so Slurm cannot wait for it; submit this job again once it is in Slurm."
            )
            % {"ids": ", ".join(str(pk) for pk in missing)}
        )
    return ":".join([job.dependency_kind, *(str(slurm_ids[pk]) for pk in wanted)])


@contextmanager
def _slurm_errors(refused: Callable[[SlurmError], str]) -> Iterator[None]:
    """Slurm's failures as the member's refusals: unreachable (503, since when, try again) or
    refused (400, why). Within a few seconds of a call that found Slurm unreachable, the
    member is answered at once, without waiting on Slurm again (``member_call``)."""
    try:
        member_call()
        yield
    except SlurmSetupError as exc:
        raise SlurmNotSetUp(
            _(
                "The portal could not run Slurm's commands as your unix user (%(error)s). "
                "This is the portal's setup, not your job: the lab's admins see it on the "
                "Slurm setup check. Nothing was changed."
            )
            % {"error": exc}
        ) from exc
    except SlurmUnavailable as exc:
        since = slurm_unreachable_since() or timezone.now()
        raise SlurmDown(
            _(
                "Slurm is unreachable (since %(since)s): %(error)s. Nothing was changed; try again in a minute."
            )
            % {"since": timezone.localtime(since).strftime("%Y-%m-%d %H:%M"), "error": exc}
        ) from exc
    except SlurmError as exc:
        raise SlurmRefused(refused(exc)) from exc


def _prepared(job: Job, client: SlurmClient) -> SubmitRequest:
    """The sbatch request for ``job`` as its owner's unix user (refusals: JobRefused)."""
    if job.kind == Job.Kind.TERMINAL:
        raise JobRefused(
            _(
                "Terminal sessions need LabPortal's node agents; on this Slurm cluster start a JupyterLab session and open a terminal in it (File → New → Terminal)."
            )
        )
    unix_user = unix_user_for(job.owner)
    gpu_type = ""
    if job.gpu_model:  # Slurm's own GRES types now, not the portal's last inventory
        with _slurm_errors(
            lambda exc: _("Slurm could not list its GPUs: %(error)s") % {"error": exc}
        ):
            nodes = client.nodes()
        gpu_type = slurm_gpu_type(job.gpu_model, {t for n in nodes for t, _n in n.gpu_types})
    # In the category's account, whose association carries the category's limits.
    account = member_account(category_id=job.owner.category_id, unix_user=unix_user)
    return submit_request(job, unix_user=unix_user, gpu_type=gpu_type, account=account)


def _sbatch(client: SlurmClient, request: SubmitRequest) -> int:
    with _slurm_errors(
        lambda exc: (
            _("Slurm refused the job as unix user %(user)s: %(error)s")
            % {"user": request.unix_user, "error": exc}
        )
    ):
        slurm_job_id = client.submit(request)
    close_host_problems()  # sbatch ran as the member: the portal host is set up
    return slurm_job_id


def slurm_job_submit(*, job: Job, client: SlurmClient | None = None) -> SlurmJob:
    """sbatch the saved job as its owner's unix user; a refusal rolls the submission back."""
    client = client or client_from_settings()
    request = _prepared(job, client)
    slurm_job_id = _sbatch(client, request)
    record = SlurmJob.objects.create(
        slurm_job_id=slurm_job_id,
        job=job,
        user=job.owner,
        unix_user=request.unix_user,
        name=request.name,
        partition=request.partition,
        qos=request.qos,
        state="PENDING",
        gpus=job.gpus,
        submitted_at=job.submitted_at,
        output_path=request.output_path.replace("%j", str(slurm_job_id)),
    )
    from jobqueue.events import record_event

    record_event(
        job,
        "dispatched",
        gettext_noop("Submitted to Slurm as job %(slurm_id)s, run as unix user %(user)s."),
        params={"slurm_id": slurm_job_id, "user": request.unix_user},
    )
    return record


def array_spec(indices: Iterable[int]) -> str:
    """The indices as sbatch's --array ranges: [0, 1, 2, 5] → "0-2,5"."""
    spans: list[list[int]] = []
    for index in sorted(set(indices)):
        if spans and index == spans[-1][1] + 1:
            spans[-1][1] = index
        else:
            spans.append([index, index])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def array_script(script: str, tasks: list[Job]) -> str:
    """The first task's batch script, each task told its portal job id and its index: from
    the index where the ids follow the indices (one INSERT numbers them so), else a table."""
    offsets = {t.pk - int(t.array_index or 0) for t in tasks}
    if len(offsets) == 1:
        (offset,) = offsets
        lookup = f"LABPORTAL_JOB_ID=$((SLURM_ARRAY_TASK_ID + {offset}))\n"
    else:
        cases = "".join(f"  {t.array_index}) LABPORTAL_JOB_ID={t.pk} ;;\n" for t in tasks)
        lookup = f'case "$SLURM_ARRAY_TASK_ID" in\n{cases}esac\n'
    tell = f'{lookup}export LABPORTAL_JOB_ID {ARRAY_INDEX_ENV}="$SLURM_ARRAY_TASK_ID"\n'
    head, _newline, body = script.partition("\n")
    comment, _newline, rest = body.partition("\n") if body.startswith("#") else ("", "", body)
    return f"{head}\n{comment + chr(10) if comment else ''}{tell}{rest}"


def slurm_array_submit(*, tasks: list[Job], client: SlurmClient | None = None) -> SlurmArray:
    """A portal job array (its tasks saved, in the same transaction) as one ``sbatch
    --array``: Slurm keeps one record for the tasks not started, as for its own arrays."""
    client = client or client_from_settings()
    first = tasks[0]
    request = _prepared(first, client)
    output = Path(settings.LABPORTAL_SLURM_OUTPUT_DIR) / f"labportal-{first.array_id}-%A_%a.out"
    name = first.name.rsplit("[", 1)[0] if first.name else ""
    environment = {
        k: v
        for k, v in request.environment.items()
        if k not in (ARRAY_INDEX_ENV, "LABPORTAL_JOB_ID")
    }
    request = replace(
        request,
        name=(name or f"labportal-array-{first.array_id}")[:100],
        output_path=str(output),
        script=array_script(request.script, tasks),
        environment=environment,
        array=array_spec(int(t.array_index or 0) for t in tasks),
    )
    array_job_id = _sbatch(client, request)
    array = SlurmArray.objects.create(
        array_job_id=array_job_id,
        portal_array_id=first.array_id or first.pk,
        unix_user=request.unix_user,
        output_pattern=str(output),
    )
    from jobqueue.events import event_for

    message = gettext_noop(
        "Submitted to Slurm as task %(slurm_id)s of array %(array)s, run as unix user %(user)s."
    )
    JobEvent.objects.bulk_create(
        event_for(
            task,
            "dispatched",
            message,
            params={
                "slurm_id": array.task_spec(int(task.array_index or 0)),
                "array": array_job_id,
                "user": request.unix_user,
            },
        )
        for task in tasks
    )
    return array


def slurm_job_cancel(*, job: Job, actor: User, client: SlurmClient | None = None) -> None:
    """scancel as the job's unix user; the sync records the end Slurm reports."""
    from jobqueue.events import record_event

    target = _slurm_target(job)
    if target is None:  # never reached Slurm (refused): nothing runs
        _apply_state(job, Job.State.CANCELLED, at=timezone.now(), reason="cancelled")
        return
    slurm_id, unix_user, waiting = target
    with _slurm_errors(lambda exc: _("Slurm could not cancel the job: %(error)s") % {"error": exc}):
        (client or client_from_settings()).cancel(slurm_id, unix_user=unix_user)
    if waiting:  # a task not started yet: Slurm forgets it at once (no record, no accounting)
        _apply_state(job, Job.State.CANCELLED, at=timezone.now(), reason="cancelled")
        return
    job.stop_requested_at = timezone.now()
    job.end_reason = "cancelled"
    job.save(update_fields=["stop_requested_at", "end_reason"])
    record_event(
        job,
        "stop_requested",
        gettext_noop("Cancel requested; Slurm is ending job %(slurm_id)s."),
        params={"slurm_id": slurm_id},
        actor=actor,
    )


def slurm_job_stop(*, job: Job, client: SlurmClient | None = None) -> None:
    """A stop the portal decided (a booking ended, an idle job, a hard limit): scancel as the
    job's unix user; the job's own record of the stop is the job queue's, the end Slurm's.

    Like a stop sent to an agent, it never fails the caller's decision (a booking's end, a
    force end): a Slurm that refuses or is away is logged, and the job's record of the stop
    stays, so an admin sees it asked.
    """
    target = _slurm_target(job)
    if target is None:
        return
    slurm_id, unix_user, _waiting = target
    try:
        (client or client_from_settings()).cancel(slurm_id, unix_user=unix_user)
    except SlurmError as exc:
        log.warning("Slurm could not stop job %s (Slurm %s): %s", job.pk, slurm_id, exc)


def _slurm_target(job: Job) -> tuple[int | str, str, bool] | None:
    """What scancel names for ``job`` and as whom: its Slurm job, or, for an array task
    Slurm has not reported on its own, its task id ("41_3", waiting: True); None when
    the job never reached Slurm."""
    record = SlurmJob.objects.filter(job=job).first()
    if record is not None:
        return record.slurm_job_id, record.unix_user, False
    array = (
        SlurmArray.objects.filter(portal_array_id=job.array_id).first()
        if job.array_id is not None
        else None
    )
    if array is None:
        return None
    return array.task_spec(int(job.array_index or 0)), array.unix_user, True


def slurm_job_output(*, job: Job, lines: int = 200) -> str:
    """The last ``lines`` of the job's Slurm output file, stored on the job; '' if unreadable."""
    record = SlurmJob.objects.filter(job=job).first()
    if record is None or not record.output_path:
        return job.log_tail
    try:
        with open(record.output_path, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return job.log_tail
    tail = "\n".join(text.splitlines()[-lines:])
    if tail != job.log_tail:
        Job.objects.filter(pk=job.pk).update(log_tail=tail)
        job.log_tail = tail
    return tail


# -- reconciliation ----------------------------------------------------------------------

# Slurm's base job states → the portal's. Everything not listed is treated as running.
_STATES = {
    "PENDING": Job.State.PENDING,
    "REQUEUED": Job.State.PENDING,
    "REQUEUE_HOLD": Job.State.PENDING,
    "REQUEUE_FED": Job.State.PENDING,
    "COMPLETED": Job.State.COMPLETED,
    "FAILED": Job.State.FAILED,
    "OUT_OF_MEMORY": Job.State.FAILED,
    "DEADLINE": Job.State.FAILED,
    "CANCELLED": Job.State.CANCELLED,
    "REVOKED": Job.State.CANCELLED,
    "PREEMPTED": Job.State.CANCELLED,
    "TIMEOUT": Job.State.TIMED_OUT,
    # Ended by the system, not by the job: lost, as the accounting refunds them
    # (slurm.accounting.SYSTEM_FAILURES).
    "NODE_FAIL": Job.State.LOST,
    "BOOT_FAIL": Job.State.LOST,
}

# Slurm's pending reasons → the portal's reason codes (its pages word them); others stay raw.
_REASONS = {
    "Resources": "resources",
    "Priority": "priority",
    "Reservation": "reservation",
    "JobHeldUser": "held",
    "JobHeldAdmin": "held",
    # Slurm says this also while the nodes are up but held by a reservation.
    "ReqNodeNotAvail": "nodes_reserved",
    "PartitionDown": "node_unavailable",
    "PartitionNodeLimit": "constraints",
    "BadConstraints": "constraints",
}


def portal_state(info: JobInfo) -> str:
    """The portal state for a Slurm state (pending/running/completed/failed/cancelled/timeout)."""
    return portal_state_of(info.state)


def portal_state_of(slurm_state: str) -> str:
    """The portal state for Slurm's base state name (``CANCELLED by 0`` reads as CANCELLED)."""
    base = slurm_state.split()[0] if slurm_state else ""
    return str(_STATES.get(base, Job.State.RUNNING))


def portal_reason(slurm_reason: str) -> str:
    if slurm_reason in _REASONS:
        return _REASONS[slurm_reason]
    if slurm_reason.startswith(("QOSMax", "AssocMax", "AssocGrp", "QOSGrp")):
        return "user_limit"
    return slurm_reason[:32]


@dataclass
class SyncResult:
    seen: int = 0
    created: int = 0
    changed: int = 0
    from_accounting: int = 0


def slurm_jobs_sync(*, client: SlurmClient | None = None) -> SyncResult:
    """Reconcile every Slurm job with the portal; running it twice changes nothing more.

    Live jobs come from squeue/slurmrestd; a portal job Slurm has already forgotten is
    looked up in accounting. Jobs submitted with plain sbatch are recorded too (their
    member found through the unix logins), so pages and accounting see them. A portal
    array's task gets its record once Slurm reports it on its own (``_ArrayTasks``).
    """
    client = client or client_from_settings()
    result = SyncResult()
    arrays = _ArrayTasks.open()
    live = [info for info in client.jobs() if not arrays.take_pending(info)]
    seen_ids = {info.job_id for info in live}
    missing = SlurmJob.objects.unfinished().exclude(slurm_job_id__in=seen_ids)
    oldest = missing.order_by("submitted_at").values_list("submitted_at", flat=True).first()
    unseen = arrays.unseen(live)
    if unseen:
        oldest = min(filter(None, [oldest, *(arrays.submitted_at(a) for a in unseen)]))
    accounted: list[JobInfo] = []
    accounting_answered = False
    if missing.exists() or unseen:
        since = oldest or timezone.now() - timedelta(days=1)
        wanted = set(missing.values_list("slurm_job_id", flat=True))
        try:
            accounted = [
                info
                for info in client.accounting_jobs(since=since - timedelta(minutes=5))
                if (info.job_id in wanted or info.array_job_id in unseen)
                and not arrays.take_pending(info)
            ]
            accounting_answered = True
        except SlurmError:
            accounted = []  # no accounting: the jobs stay as last seen until Slurm reports them
    result.from_accounting = len(accounted)
    logins = dict(UnixLogin.objects.values_list("username", "user_id"))
    infos = {info.job_id: info for info in [*live, *accounted]}
    result.seen = len(infos)
    # One read of what the portal knows, writes only for what changed: a pass over
    # thousands of unchanged jobs is a handful of queries.
    known: dict[int, SlurmJob] = {}
    ids = list(infos)
    for chunk in range(0, len(ids), SYNC_CHUNK):
        known.update(
            SlurmJob.objects.in_bulk(ids[chunk : chunk + SYNC_CHUNK], field_name="slurm_job_id")
        )
    new, changed = [], []
    for job_id, info in infos.items():
        record = known.get(job_id)
        if record is None:
            record = SlurmJob(slurm_job_id=job_id, name=info.name[:200])
            arrays.link(record, info)
            _copy_info(record, info, logins)
            new.append(record)
        else:
            # Recorded before its array was (a sync that ran while the submit committed).
            relinked = record.job_id is None and arrays.link(record, info)
            if _copy_info(record, info, logins) or relinked:
                changed.append(record)
    SlurmJob.objects.bulk_create(new, batch_size=SYNC_CHUNK, ignore_conflicts=True)
    SlurmJob.objects.bulk_update(changed, [*_SYNCED_FIELDS, "job"], batch_size=SYNC_CHUNK)
    arrays.forget_pending_records()
    result.created, result.changed = len(new), len(changed)
    records = {**known, **{r.slurm_job_id: r for r in new}}
    linked = {r.job_id: r.slurm_job_id for r in records.values() if r.job_id is not None}
    open_jobs = Job.objects.filter(pk__in=list(linked)).exclude(state__in=Job.FINAL_STATES)
    job_ids = list(open_jobs.values_list("pk", flat=True))
    # One transaction per chunk of jobs, not per job: the first pass after a switch to
    # Slurm mode (or a long outage) ends thousands, and a commit each dominated it.
    for chunk in range(0, len(job_ids), APPLY_CHUNK):
        with transaction.atomic():
            for job_id in job_ids[chunk : chunk + APPLY_CHUNK]:
                if _apply_to_job(job_id, infos[linked[job_id]]):
                    result.changed += 1
    result.changed += arrays.apply_waiting(set(linked), forgotten=accounting_answered)
    started = Job.objects.filter(pk__in=job_ids).exclude(started_at=None)
    for job_id, ended in started.values_list("pk", "ended_at"):
        record = records[linked[job_id]]
        slurm_job_log_sync(job_id=job_id, record=record, final=ended is not None)
    _sync_gpu_holders(live, logins, {r.slurm_job_id: r.job_id for r in records.values()})
    return result


# An array whose tasks have all ended is still matched this long, for the record of a task
# that started just as the portal cancelled it.
ARRAY_LOOKBACK = timedelta(days=2)


class _ArrayTasks:
    """The portal's arrays in Slurm during one sync: their tasks by index, and the pending
    record that holds the tasks Slurm has not started."""

    def __init__(self, arrays: list[SlurmArray]) -> None:
        self.arrays = {a.array_job_id: a for a in arrays}
        by_portal = {a.portal_array_id: a.array_job_id for a in arrays}
        self.tasks: dict[tuple[int, int], tuple[int, bool]] = {}  # → (job pk, ended)
        rows = Job.objects.filter(array_id__in=list(by_portal)).values_list(
            "pk", "array_id", "array_index", "state"
        )
        for pk, array_id, index, state in rows:
            if array_id is not None:
                ended = state in Job.FINAL_STATES
                self.tasks[(by_portal[array_id], int(index or 0))] = (pk, ended)
        self.pending: dict[int, JobInfo] = {}  # job pk → the pending record it waits in
        self.pending_ids: set[int] = set()  # the pending records' own Slurm job ids

    @classmethod
    def open(cls) -> _ArrayTasks:
        waiting = Job.objects.filter(array_id=OuterRef("portal_array_id")).exclude(
            state__in=Job.FINAL_STATES
        )
        recent = timezone.now() - ARRAY_LOOKBACK
        return cls(
            list(SlurmArray.objects.filter(Q(Exists(waiting)) | Q(submitted_at__gte=recent)))
        )

    def take_pending(self, info: JobInfo) -> bool:
        """True for a portal array's record of tasks not started (kept here, not a job)."""
        if info.array_job_id not in self.arrays or info.array_task_id is not None:
            return False
        self.pending_ids.add(info.job_id)
        for index in array_task_indices(info.array_pending):
            task = self.tasks.get((info.array_job_id, index))
            if task is not None:
                self.pending[task[0]] = info
        return True

    def unseen(self, live: list[JobInfo]) -> set[int]:
        """The arrays with a waiting task that Slurm reports neither on its own nor pending."""
        reported = {(i.array_job_id, i.array_task_id) for i in live if i.array_job_id}
        return {
            array_job_id
            for (array_job_id, index), (pk, ended) in self.tasks.items()
            if not ended and pk not in self.pending and (array_job_id, index) not in reported
        }

    def submitted_at(self, array_job_id: int) -> datetime:
        return self.arrays[array_job_id].submitted_at

    def link(self, record: SlurmJob, info: JobInfo) -> bool:
        """A task's first record: its portal job, and its output file. True if linked."""
        if info.array_job_id not in self.arrays or info.array_task_id is None:
            return False
        task = self.tasks.get((info.array_job_id, info.array_task_id))
        if task is None:
            return False
        array = self.arrays[info.array_job_id]
        record.job_id = task[0]
        record.output_path = array.output_path(info.array_task_id)[:500]
        return True

    def forget_pending_records(self) -> None:
        """A pending record recorded as a plain job before its array was known goes: its
        tasks are the portal's, and the id comes back as a task's own record."""
        if self.pending_ids:
            SlurmJob.objects.filter(slurm_job_id__in=self.pending_ids, job=None).delete()

    def apply_waiting(self, linked: set[int], *, forgotten: bool) -> int:
        """Tasks with no record of their own yet take the pending record's reason and
        estimate; one Slurm reports nowhere (not pending, not in accounting) was cancelled
        in Slurm before it started (``scancel 41_3``). Returns the jobs changed."""
        changed = 0
        waiting = [pk for pk, ended in self.tasks.values() if not ended and pk not in linked]
        for chunk in range(0, len(waiting), APPLY_CHUNK):
            with transaction.atomic():
                for pk in waiting[chunk : chunk + APPLY_CHUNK]:
                    if pk in self.pending:
                        changed += _apply_to_job(pk, self.pending[pk])
                    elif forgotten:
                        job = Job.objects.select_for_update().get(pk=pk)
                        if not job.is_final:
                            from jobqueue.events import record_event

                            record_event(
                                job,
                                "cancelled",
                                gettext_noop(
                                    "Cancelled in Slurm before it started (scancel outside "
                                    "the portal)."
                                ),
                            )
                            _apply_state(
                                job, Job.State.CANCELLED, at=timezone.now(), reason="cancelled"
                            )
                            changed += 1
        return changed


def _sync_gpu_holders(
    live: list[JobInfo], logins: dict[str, int], portal_jobs: dict[int, int | None]
) -> int:
    """Each GPU a running Slurm job holds (by Slurm's GPU index on its node) is marked in
    use by it, plain sbatch jobs too, so the GPUs page and the dashboard count what Slurm
    has allocated; GPUs no longer held are freed. Returns the GPUs changed."""
    wanted: dict[tuple[str, int], tuple[str, int | None]] = {}
    for info in live:
        if info.state != "RUNNING" or not info.nodes or not info.gpu_indices:
            continue
        portal_job = portal_jobs.get(info.job_id)
        label = (
            f"#{portal_job} · Slurm {info.job_id} · {info.user}"
            if portal_job
            else f"Slurm {info.job_id} · {info.user}"
        )[:120]
        node = info.nodes.split(",")[0]  # multi-node jobs: IDX is given for the first node
        for index in info.gpu_indices:
            wanted[(node, index)] = (label, logins.get(info.user))
    changed = 0
    gpus = Gpu.objects.filter(kind=Gpu.Kind.WHOLE).select_related("node")
    held = gpus.exclude(held_by="")
    candidates = {(g.node.name, g.index): g for g in held}
    if wanted:
        for gpu in gpus.filter(node__name__in={node for node, _ in wanted}):
            candidates[(gpu.node.name, gpu.index)] = gpu
    for key, gpu in candidates.items():
        label, user_id = wanted.get(key, ("", None))
        if (gpu.held_by, gpu.held_by_user_id) != (label, user_id):
            gpu.held_by, gpu.held_by_user_id = label, user_id
            gpu.save(update_fields=["held_by", "held_by_user"])
            changed += 1
    return changed


# Per job and pass, at most this much of a Slurm job's output file is copied into its log.
LOG_SYNC_MAX_BYTES = 16 * 1024 * 1024


def slurm_job_log_sync(*, job_id: int, record: SlurmJob, final: bool) -> int:
    """Copy the new part of a Slurm job's output file into its full log (``joblogs``).

    The file is read from where the log ends, so a pass copies only what is new and a
    second pass nothing; ``final`` (the job has ended) marks the log complete at the
    file's end. Returns the bytes copied; an unreadable file copies nothing.
    """
    if not record.output_path:
        return 0
    stream = f"slurm-{record.slurm_job_id}"
    log = JobLog.objects.filter(job_id=job_id, stream=stream).first()
    if log is not None and log.complete:
        return 0
    offset = log.received_end if log is not None else 0
    copied = 0
    try:
        with open(record.output_path, "rb") as handle:
            handle.seek(offset)
            while copied < LOG_SYNC_MAX_BYTES:
                data = handle.read(MAX_LOG_CHUNK_BYTES)
                at_end = len(data) < MAX_LOG_CHUNK_BYTES
                if data or (final and at_end):
                    job_log_append(
                        job_id=job_id,
                        stream=stream,
                        offset=offset + copied,
                        data=data,
                        final=final and at_end,
                    )
                copied += len(data)
                if at_end:
                    break
    except OSError:
        return copied
    return copied


SYNC_CHUNK = 2000
APPLY_CHUNK = 100  # portal jobs brought to Slurm's state per transaction
_SYNCED_FIELDS = [
    "unix_user",
    "user",
    "state",
    "reason",
    "partition",
    "qos",
    "account",
    "nodes",
    "gpus",
    "estimated_start",
    "submitted_at",
    "started_at",
    "ended_at",
    "exit_code",
    "output_path",
    "synced_at",
]


def _copy_info(record: SlurmJob, info: JobInfo, logins: dict[str, int]) -> bool:
    """Copy what Slurm reports onto the record; True if anything changed."""
    fields = {
        "unix_user": info.user or record.unix_user,
        "user_id": record.user_id or logins.get(info.user),
        "state": info.state,
        "reason": info.reason[:120],
        "partition": info.partition,
        "qos": info.qos,
        "account": info.account,
        "nodes": info.nodes[:255],
        "gpus": info.gpus,
        "estimated_start": info.estimated_start,
        "submitted_at": info.submitted_at or record.submitted_at,
        "started_at": info.started_at,
        "ended_at": info.ended_at if portal_state(info) in Job.FINAL_STATES else None,
        "exit_code": info.exit_code,
        "output_path": record.output_path or info.output_path[:500],
    }
    changed = [k for k, v in fields.items() if getattr(record, k) != v]
    for key in changed:
        setattr(record, key, fields[key])
    if changed:
        record.synced_at = timezone.now()
    return bool(changed)


def _niced_for_credit(job: Job, info: JobInfo) -> bool:
    """Whether the job waits behind others because its owner has no credit: the policy
    pass nices such jobs, except under the emergency or a grant queue's QOS."""
    if info.qos and (info.qos == top_qos_name() or info.qos in grant_qos_names().values()):
        return False
    return not CreditAccount.objects.filter(user_id=job.owner_id, balance__gt=0).exists()


def _apply_to_job(job_id: int, info: JobInfo) -> bool:
    """Bring the portal job to Slurm's state; False when it already is there."""
    job = Job.objects.select_for_update().select_related("owner").get(pk=job_id)
    if job.is_final:
        return False
    target = portal_state(info)
    now = timezone.now()
    update: dict[str, object] = {}
    if target in Job.WAITING_STATES:
        reason = portal_reason(info.reason) or "priority"
        if reason in ("priority", "resources") and _niced_for_credit(job, info):
            reason = "no_credit"
        update = {"pending_reason": reason, "estimated_start": info.estimated_start}
    elif target == Job.State.RUNNING:
        node = Node.objects.filter(name=info.nodes.split(",")[0]).first() if info.nodes else None
        update = {
            "state": Job.State.RUNNING,
            "started_at": info.started_at or job.started_at or now,
            "node_id": node.pk if node else job.node_id,
            "pending_reason": "",
            "estimated_start": None,
        }
    changed = {k: v for k, v in update.items() if getattr(job, k) != v}
    if changed:
        was_waiting = job.state in Job.WAITING_STATES
        for key, value in changed.items():
            if key == "state":
                job.move_to(str(value))
            else:
                setattr(job, key, value)
        job.save(update_fields=list(changed))
        if target == Job.State.RUNNING and was_waiting:
            from jobqueue.events import record_event

            record_event(
                job,
                "started",
                gettext_noop("Slurm started it on %(node)s (Slurm job %(slurm_id)s)."),
                params={"node": info.nodes, "slurm_id": info.job_id},
            )
    if target in Job.FINAL_STATES:
        reason = "cancelled" if target == Job.State.CANCELLED else info.reason or info.state.lower()
        if info.started_at and not job.started_at:
            job.started_at = info.started_at
        if info.nodes and job.node_id is None:
            job.node = Node.objects.filter(name=info.nodes.split(",")[0]).first()
        # Slurm records a job it ended at its time limit with the code "0:15" (its
        # signal): its exit code is not known, and "0" would read as a success.
        exit_code = None if target == Job.State.TIMED_OUT and not info.exit_code else info.exit_code
        _apply_state(job, target, at=info.ended_at or now, exit_code=exit_code, reason=reason)
        slurm_job_output(job=job)
        return True
    return bool(changed)


def _apply_state(
    job: Job, state: str, *, at: datetime, exit_code: int | None = None, reason: str = ""
) -> None:
    """End the portal job as Slurm ended it, as the agents' path ends one (credits, notice)."""
    from jobqueue.events import record_event
    from jobqueue.services import finish_locked

    job.pending_reason = ""
    job.estimated_start = None
    job.queue_position = None
    record_event(job, "ended", gettext_noop("Ended in Slurm: %(state)s."), params={"state": state})
    finish_locked(job, state, at=at, exit_code=exit_code, reason=reason[:200])


# -- inventory -----------------------------------------------------------------------------


def _node_state(info: NodeInfo) -> str:
    if (
        info.state in ("down", "fail", "failing", "unknown", "future")
        or "NOT_RESPONDING" in info.flags
    ):
        return Node.State.DOWN
    if "DRAIN" in info.flags or info.state in ("drain", "draining", "drained"):
        return Node.State.DRAINING
    return Node.State.UP


@dataclass
class InventoryResult:
    nodes: int = 0
    gpus: int = 0
    partitions: int = 0


@transaction.atomic
def slurm_inventory_sync(*, client: SlurmClient | None = None) -> InventoryResult:
    """Nodes, their GPUs (GRES) and states, and the partitions, from Slurm into the portal.

    A node Slurm no longer lists is marked down (its history stays); GPUs beyond the
    node's GRES count are marked missing. GPUs Slurm counts get stable placeholder ids
    (``slurm:<node>:<index>``) unless the node's agent has registered real ones.
    """
    client = client or client_from_settings()
    nodes = client.nodes()
    partitions = client.partitions()
    now = timezone.now()
    result = InventoryResult()
    by_name: dict[str, Node] = {}
    for info in nodes:
        node, _created = Node.objects.get_or_create(name=info.name)
        labels = {**node.labels, "slurm_partitions": list(info.partitions)}
        if info.gpu_type:
            labels["slurm_gpu_type"] = info.gpu_type
        state = _node_state(info)
        fields = {
            "state": state,
            "labels": labels,
            "hostname": node.hostname or info.address,
            "last_heartbeat": now,
            "down_since": (node.down_since or now) if state == Node.State.DOWN else None,
        }
        for key, value in fields.items():
            setattr(node, key, value)
        node.save()
        by_name[info.name] = node
        result.nodes += 1
        result.gpus += _sync_gpus(node, info)
    Node.objects.filter(labels__has_key="slurm_partitions").exclude(name__in=by_name).update(
        state=Node.State.DOWN
    )
    _sync_partitions(partitions, nodes, by_name, now)
    result.partitions = len(partitions)
    return result


def _gpu_kinds(info: NodeInfo) -> list[str]:
    """The GRES type of each of the node's GPUs by index, in slurm.conf's order."""
    kinds = [kind for kind, count in info.gpu_types for _ in range(count)]
    return kinds if len(kinds) == info.gpus else [info.gpu_type] * info.gpus


def _sync_gpus(node: Node, info: NodeInfo) -> int:
    existing = {g.index: g for g in node.gpus.filter(parent__isnull=True)}
    placeholder = f"slurm:{node.name}:"
    for index, kind in enumerate(_gpu_kinds(info)):
        model = kind or "GPU"
        # Unknown (0) unless the admin gave this GRES type's memory; an agent's report
        # replaces the placeholder row altogether (cluster.services._gpus_upsert).
        memory_mb = settings.LABPORTAL_SLURM_GPU_MEMORY_MB.get(kind.lower(), 0)
        gpu = existing.get(index)
        if gpu is None:
            Gpu.objects.create(
                node=node,
                index=index,
                uuid=f"{placeholder}{index}",
                model=model,
                memory_mb=memory_mb,
            )
            continue
        changed = []
        if gpu.state == Gpu.State.MISSING:
            gpu.state = Gpu.State.AVAILABLE
            changed.append("state")
        if gpu.uuid.startswith(placeholder) and gpu.memory_mb != memory_mb:
            gpu.memory_mb = memory_mb
            changed.append("memory_mb")
        if gpu.uuid.startswith(placeholder) and gpu.model != model:
            gpu.model = model
            changed.append("model")
        if changed:
            gpu.save(update_fields=changed)
    gone = [g.pk for i, g in existing.items() if i >= info.gpus]
    Gpu.objects.filter(pk__in=gone).exclude(state=Gpu.State.DISABLED).update(
        state=Gpu.State.MISSING
    )
    return info.gpus


def _sync_partitions(
    partitions: Iterable[PartitionInfo],
    nodes: list[NodeInfo],
    by_name: dict[str, Node],
    now: datetime,
) -> None:
    names = []
    for info in partitions:
        partition, _created = Partition.objects.update_or_create(
            name=info.name,
            defaults={
                "state": info.state,
                "is_default": info.is_default,
                "max_time_s": info.max_time_s,
                "synced_at": now,
            },
        )
        partition.nodes.set(
            [by_name[n.name] for n in nodes if info.name in n.partitions and n.name in by_name]
        )
        names.append(info.name)
    Partition.objects.exclude(name__in=names).delete()


def plain_jobs_live(limit: int = 200) -> list[OutsideLiveJob]:
    """The plain-sbatch jobs waiting or running as the last sync saw them (the queue page)."""
    records = (
        SlurmJob.objects.unfinished()
        .filter(job__isnull=True)
        .select_related("user")
        .order_by("slurm_job_id")[:limit]
    )
    return [
        OutsideLiveJob(
            external_id=str(r.slurm_job_id),
            owner=r.user.username if r.user else r.unix_user,
            where="/".join(part for part in (r.partition, r.qos) if part),
            gpus=r.gpus,
            running=r.state == "RUNNING",
            reason="" if r.state == "RUNNING" else r.reason,
            started_at=r.started_at if r.state == "RUNNING" else None,
            node=r.nodes if r.state == "RUNNING" else "",
        )
        for r in records
    ]

"""Credits from Slurm's accounting: every job in ``sacct`` is charged, portal-submitted or not.

The rules are the portal's own (docs/slurm.md, "Credits"):

- A job costs its allocated GPUs × its run time × its queue's credit rate. A portal job's
  queue is its own; a job submitted with plain ``sbatch`` is matched to a queue through
  the queue mappings (QOS and partition), else ``LABPORTAL_SLURM_DEFAULT_QUEUE``.
- The Slurm user is mapped to the member through their unix login; a job of a unix user
  no member has is reported, never charged.
- Running jobs are charged as they go, up to the last charging window (the credit policy's
  interval), exactly as the agents' mode does; when the job ends the charge is settled
  on Slurm's own elapsed time. A job is never blocked by its charge.
- Every posting has an idempotency key, so a pass repeated (or two passes at once)
  charges nothing twice; a settled job is skipped without touching the ledger.
- A portal job's postings use the portal's own keys for that run (``job:<id>:run:<t>``),
  so the agents-mode charger and the settlement, should they run on the same job, add
  nothing on top. After the settlement the portal judges the job's efficiency from its
  GPU telemetry (the agent's monitor-only mode), so the efficiency reward applies.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import CreditPolicy, LedgerEntry, Project, User
from accounts.services import Posting, ledger_post, ledger_post_batch
from credits.services import charge_window_floor, charged_for_run, credits_settle_job, gpu_cost
from jobqueue.executor import OutsideJob
from jobqueue.models import Job, Queue
from slurm.cli import JobInfo, portal_commands
from slurm.models import QueueMapping, SlurmJob, UnixLogin
from slurm.rules_models import SlurmCharge
from slurm.services import portal_state_of

log = logging.getLogger(__name__)

ZERO = Decimal("0")


# -- pure rules ----------------------------------------------------------------------


# Jobs that ended through the system, not the member: what they were charged is given back.
SYSTEM_FAILURES = frozenset({"NODE_FAIL", "BOOT_FAIL"})


@dataclass(frozen=True)
class ChargePoint:
    """How far a job is to be charged now: ``seconds`` of run time, ``final`` once it ended."""

    seconds: int
    final: bool
    upto: datetime | None  # the charging window's end for a running job


def charge_point(record: JobInfo, *, now: datetime, interval_minutes: int) -> ChargePoint | None:
    """Where the charge of ``record`` stands at ``now``; None when there is nothing to charge yet."""
    if record.started_at is None or record.gpus <= 0:
        return None
    if record.ended_at is not None:
        if record.state in SYSTEM_FAILURES:
            return ChargePoint(seconds=0, final=True, upto=None)  # refunded, as in agents mode
        if record.elapsed_s is not None:
            seconds = record.elapsed_s
        else:
            seconds = int((record.ended_at - record.started_at).total_seconds())
        return ChargePoint(seconds=max(0, seconds), final=True, upto=None)
    upto = charge_window_floor(now, interval_minutes)
    if upto <= record.started_at:
        return None
    return ChargePoint(
        seconds=int((upto - record.started_at).total_seconds()), final=False, upto=upto
    )


def queue_for(
    record: JobInfo, mappings: Iterable[tuple[str, str, int]], default_queue_id: int | None
) -> int | None:
    """The queue a plain-``sbatch`` job is charged at: the mapping matching both its QOS and
    partition, else its QOS, else its partition, else the default queue.

    ``mappings`` are (partition, qos, queue id); empty fields match nothing.
    """
    best: tuple[int, int] | None = None
    for partition, qos, queue_id in mappings:
        qos_hit = bool(qos) and qos == record.qos
        partition_hit = bool(partition) and partition == record.partition
        if (qos and not qos_hit) or (partition and not partition_hit):
            continue
        score = 2 * qos_hit + partition_hit
        if score and (best is None or score > best[0]):
            best = (score, queue_id)
    return best[1] if best else default_queue_id


def job_key(record: JobInfo) -> str:
    """A plain job's identity in the ledger: Slurm's id and submit time (ids restart on a reset)."""
    submitted = int(record.submitted_at.timestamp()) if record.submitted_at else 0
    return f"slurm:{record.job_id}:{submitted}"


# -- the reconciliation pass -------------------------------------------------------------


@dataclass
class ReconcileResult:
    seen: int = 0
    charged: int = 0
    settled: int = 0
    skipped: int = 0
    unknown_users: set[str] = field(default_factory=set)

    def as_dict(self) -> dict[str, object]:
        return {
            "seen": self.seen,
            "charged": self.charged,
            "settled": self.settled,
            "skipped": self.skipped,
            "unknown_users": sorted(self.unknown_users),
        }


@dataclass(frozen=True)
class _Lookups:
    members: dict[str, User]
    portal_jobs: dict[int, int]
    charges: dict[tuple[int, datetime], SlurmCharge]
    rates: dict[int, Decimal]
    mappings: list[tuple[str, str, int]]
    default_queue_id: int | None
    interval_minutes: int
    # Active project name → (its id, the ids of who may charge it: the PI and members).
    projects: dict[str, tuple[int, frozenset[int]]]

    def project_for(self, record: JobInfo, member: User) -> int | None:
        """The project a plain job's --wckey names, where its member may charge it."""
        found = self.projects.get(record.wckey) if record.wckey else None
        return found[0] if found and member.pk in found[1] else None


def _lookups(records: list[JobInfo]) -> _Lookups:
    """Everything a pass needs, read in a handful of queries whatever the number of jobs."""
    ids = [r.job_id for r in records]
    portal_jobs: dict[int, int] = {}
    charges: dict[tuple[int, datetime], SlurmCharge] = {}
    # Chunked: PostgreSQL takes any number of parameters, SQLite (the tests) 32k.
    for start in range(0, len(ids), 5000):
        chunk = ids[start : start + 5000]
        portal_jobs.update(
            SlurmJob.objects.filter(slurm_job_id__in=chunk, job__isnull=False).values_list(
                "slurm_job_id", "job_id"
            )
        )
        for charge in SlurmCharge.objects.filter(slurm_job_id__in=chunk):
            charges[(charge.slurm_job_id, charge.submitted_at)] = charge
    default_name = getattr(settings, "LABPORTAL_SLURM_DEFAULT_QUEUE", "normal")
    return _Lookups(
        members={login.username: login.user for login in UnixLogin.objects.select_related("user")},
        portal_jobs=portal_jobs,
        charges=charges,
        rates=dict(Queue.objects.values_list("id", "credit_rate")),
        mappings=list(QueueMapping.objects.values_list("partition", "qos", "queue_id")),
        default_queue_id=Queue.objects.filter(name=default_name)
        .values_list("id", flat=True)
        .first(),
        interval_minutes=CreditPolicy.current().charge_interval_minutes,
        projects=_projects_by_name({r.wckey for r in records if r.wckey}),
    )


def _projects_by_name(names: set[str]) -> dict[str, tuple[int, frozenset[int]]]:
    if not names:
        return {}
    found: dict[str, tuple[int, set[int]]] = {}
    for pk, name, pi_id, member_id in Project.objects.filter(
        active=True, name__in=names
    ).values_list("pk", "name", "pi_id", "members"):
        _pk, who = found.setdefault(name, (pk, set()))
        who.update(i for i in (pi_id, member_id) if i is not None)
    return {name: (pk, frozenset(who)) for name, (pk, who) in found.items()}


def accounting_reconcile(*, records: list[JobInfo], now: datetime | None = None) -> ReconcileResult:
    """Charge every job in ``records`` (sacct's view) up to where it stands; safe to repeat.

    Plain jobs are charged one member at a time, in one transaction each (one ledger lock,
    one balance move); portal jobs one at a time, against their run's own keys.
    """
    now = now or timezone.now()
    result = ReconcileResult(seen=len(records))
    look = _lookups(records)
    plain: dict[int, list[tuple[JobInfo, ChargePoint]]] = defaultdict(list)
    portal: list[tuple[JobInfo, ChargePoint, int]] = []
    for record in records:
        point = charge_point(record, now=now, interval_minutes=look.interval_minutes)
        if point is None:
            result.skipped += 1
            continue
        member = look.members.get(record.user)
        if member is None:
            result.unknown_users.add(record.user)
            result.skipped += 1
            continue
        existing = look.charges.get((record.job_id, record.submitted_at or record.started_at))  # type: ignore[arg-type]
        if existing is not None and (
            existing.final or (existing.charged_seconds >= point.seconds and not point.final)
        ):
            result.skipped += 1
            continue
        portal_job_id = look.portal_jobs.get(record.job_id)
        if portal_job_id is not None:
            portal.append((record, point, portal_job_id))
        else:
            plain[member.pk].append((record, point))
    for member_id in sorted(plain):  # one order for every pass: no deadlock between two
        member = next(m for m in look.members.values() if m.pk == member_id)
        try:
            moved, settled = _charge_plain_jobs(member, plain[member_id], look)
        except IntegrityError:  # another pass is charging these jobs right now
            result.skipped += len(plain[member_id])
            continue
        result.charged += moved
        result.settled += settled
    for record, point, job_id in portal:
        try:
            moved_one = _charge_portal_job(record, point, job_id)
        except IntegrityError:
            result.skipped += 1
            continue
        result.charged += int(moved_one)
        result.settled += int(point.final)
    if result.unknown_users:
        log.warning(
            "Slurm accounting: jobs of unix users no member has (not charged): %s",
            ", ".join(sorted(result.unknown_users)),
        )
    return result


def _locked_charge(record: JobInfo, **defaults: object) -> SlurmCharge:
    """The job's charge row, locked for this transaction (created on first sight)."""
    submitted = record.submitted_at or record.started_at
    assert submitted is not None
    charge = (
        SlurmCharge.objects.select_for_update()
        .filter(slurm_job_id=record.job_id, submitted_at=submitted)
        .first()
    )
    if charge is None:
        with transaction.atomic():
            charge = SlurmCharge.objects.create(
                slurm_job_id=record.job_id, submitted_at=submitted, **defaults
            )
        charge = SlurmCharge.objects.select_for_update().get(pk=charge.pk)
    return charge


@transaction.atomic
def _charge_plain_jobs(
    member: User, items: list[tuple[JobInfo, ChargePoint]], look: _Lookups
) -> tuple[int, int]:
    """One member's plain-sbatch jobs: returns (jobs charged, jobs settled)."""
    ids = [record.job_id for record, _point in items]
    locked = {
        (c.slurm_job_id, c.submitted_at): c
        for c in SlurmCharge.objects.select_for_update().filter(user=member, slurm_job_id__in=ids)
    }
    postings: list[Posting] = []
    rows: list[SlurmCharge] = []
    settled = 0
    for record, point in items:
        submitted = record.submitted_at or record.started_at
        assert submitted is not None and record.started_at is not None
        charge = locked.get((record.job_id, submitted))
        if charge is not None and (
            charge.final or (charge.charged_seconds >= point.seconds and not point.final)
        ):
            continue  # a concurrent pass got here first
        queue_id = queue_for(record, look.mappings, look.default_queue_id)
        rate = look.rates.get(queue_id, Decimal("1")) if queue_id is not None else Decimal("1")
        already = charge.charged if charge is not None else ZERO
        owed = gpu_cost(gpus=record.gpus, seconds=point.seconds, rate=rate) - already
        if owed != 0:
            suffix = ":final" if point.final else f":upto:{point.upto.isoformat()}"  # type: ignore[union-attr]
            postings.append(
                Posting(
                    amount=-owed,
                    kind=LedgerEntry.Kind.REFUND
                    if owed < 0 and record.state in SYSTEM_FAILURES
                    else LedgerEntry.Kind.CHARGE,
                    idempotency_key=job_key(record) + suffix,
                    note=(
                        f"Slurm job {record.job_id}: {record.gpus} GPU × "
                        f"{point.seconds / 3600:.3f} h × {rate}/GPU-h"
                    ),
                )
            )
        settled += int(point.final)
        rows.append(
            SlurmCharge(
                slurm_job_id=record.job_id,
                submitted_at=submitted,
                user=member,
                queue_id=queue_id,
                project_id=look.project_for(record, member),
                gpus=record.gpus,
                started_at=record.started_at,
                charged=already + owed,
                charged_seconds=point.seconds,
                final=point.final,
            )
        )
    moved = ledger_post_batch(user=member, postings=postings)
    SlurmCharge.objects.bulk_create(
        rows,
        update_conflicts=True,
        unique_fields=["slurm_job_id", "submitted_at"],
        update_fields=[
            "charged",
            "charged_seconds",
            "final",
            "gpus",
            "queue",
            "project",
            "updated_at",
        ],
    )
    return moved, settled


def _charge_portal_job(record: JobInfo, point: ChargePoint, job_id: int) -> bool:
    with transaction.atomic():
        job = Job.objects.select_related("queue", "owner").filter(pk=job_id).first()
        if job is None or job.started_at is None:
            return False  # the state sync has not marked it started yet: next pass
        rate = job.queue.credit_rate
        assert record.started_at is not None
        charge = _locked_charge(
            record,
            user_id=job.owner_id,
            job_id=job.pk,
            queue_id=job.queue_id,
            gpus=record.gpus,
            started_at=record.started_at,
        )
        if charge.final:
            return False
        # The portal's own key for this run, so its charger and settlement add nothing on top.
        run_tag = f"job:{job.pk}:run:{int(job.started_at.timestamp())}"
        owed = gpu_cost(gpus=record.gpus, seconds=point.seconds, rate=rate) - charged_for_run(
            run_tag
        )
        if point.final:
            key = f"{run_tag}:final"
            if LedgerEntry.objects.filter(idempotency_key=key).exists():
                # The portal settled it first (from its own copy of Slurm's times):
                # one adjustment brings the run to Slurm's accounting.
                key = f"{run_tag}:slurm"
        else:
            key = f"{run_tag}:upto:{point.upto.isoformat()}"  # type: ignore[union-attr]
        posted = owed > 0 if not point.final else owed != 0
        if posted:
            ledger_post(
                user=job.owner,
                amount=-owed,
                kind=LedgerEntry.Kind.REFUND
                if owed < 0 and record.state in SYSTEM_FAILURES
                else LedgerEntry.Kind.CHARGE,
                idempotency_key=key,
                job=job,
                note=(
                    f"{record.gpus} GPU × {point.seconds / 3600:.3f} h × {rate}/GPU-h "
                    f"(Slurm job {record.job_id})"
                ),
            )
        SlurmCharge.objects.filter(pk=charge.pk).update(
            charged=charged_for_run(run_tag),
            charged_seconds=point.seconds,
            final=point.final,
            gpus=record.gpus,
            updated_at=timezone.now(),
        )
    if point.final and job.state in Job.FINAL_STATES:
        # Efficiency (and its reward) from the GPU telemetry; the charge is already final.
        credits_settle_job(job_id=job.pk)
    return posted


def accounting_sync(
    *, since: datetime | None = None, now: datetime | None = None
) -> ReconcileResult:
    """Read Slurm's accounting since ``since`` (default: the lookback window) and reconcile it."""
    now = now or timezone.now()
    lookback_h = int(getattr(settings, "LABPORTAL_SLURM_ACCOUNTING_LOOKBACK_H", 48))
    since = since or now - timedelta(hours=lookback_h)
    # sacct on the portal host, as the other rules use the commands: slurmrestd's slurmdb
    # endpoints need slurmdbd to accept JWT as well, which many sites do not configure.
    records = portal_commands().accounting_jobs(since=since)
    return accounting_reconcile(records=records, now=now)


# The longest a plain job is looked back for: a job that started this long before a
# report's period and still ran into it is counted (the cluster's MaxTime is shorter).
PLAIN_JOB_LOOKBACK = timedelta(days=60)


def plain_jobs_between(*, start: datetime, end: datetime) -> list[OutsideJob]:
    """The plain-sbatch jobs that ran in [start, end), as the accounting charged them (the
    same seconds `sacct` reports): the usage report counts their GPU time with the
    portal's jobs. The node and the final state come from the last squeue/sacct view."""
    charges = list(
        SlurmCharge.objects.filter(
            job__isnull=True, started_at__lt=end, started_at__gte=start - PLAIN_JOB_LOOKBACK
        ).order_by("started_at")
    )
    seen = SlurmJob.objects.in_bulk([c.slurm_job_id for c in charges], field_name="slurm_job_id")
    jobs = []
    for charge in charges:
        ended = (
            charge.started_at + timedelta(seconds=charge.charged_seconds) if charge.final else None
        )
        if ended is not None and ended < start:
            continue
        record = seen.get(charge.slurm_job_id)
        state = ""
        if charge.final:
            state = portal_state_of(record.state) if record and record.state else ""
            if state not in Job.FINAL_STATES:
                state = str(Job.State.COMPLETED)  # settled: it ended, however Slurm last showed it
        jobs.append(
            OutsideJob(
                user_id=charge.user_id,
                queue_id=charge.queue_id,
                project_id=charge.project_id,
                node=(record.nodes.split(",")[0] if record and record.nodes else ""),
                gpus=charge.gpus,
                submitted_at=charge.submitted_at,
                started_at=charge.started_at,
                ended_at=ended,
                final_state=state,
            )
        )
    return jobs

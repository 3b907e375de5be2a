"""Charging jobs for GPU time: the running charge, the settle at a job's end, the
efficiency reward or idle notice, and the refund of a job lost through the system.

Every amount goes through the ledger of accounts/ (``ledger_entry_post`` under the
member's account lock), with an idempotency key, so a repeated call charges nothing twice.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.db.models import Avg, Count, Exists, OuterRef, Sum
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from accounts.models import CreditPolicy, JobEfficiency, LedgerEntry, User
from accounts.services import (
    ZERO,
    account_locked,
    credits_quantize,
    in_language_of,
    ledger_entry_post,
    notify,
    portal_url,
)
from jobqueue import executor
from jobqueue.models import Job
from telemetry.models import GpuSample

log = logging.getLogger(__name__)


def _run_tag(job: Job) -> str:
    """Charges are counted per run, so a requeued job's new run starts from zero."""
    assert job.started_at is not None
    return _run_tag_at(job.pk, job.started_at)


def _run_tag_at(job_id: int, started_at: datetime) -> str:
    return f"job:{job_id}:run:{int(started_at.timestamp())}"


def gpu_cost(*, gpus: int, seconds: int, rate: Decimal) -> Decimal:
    """GPU-hours times the rate, to the credit quantum (agents mode and Slurm mode alike)."""
    return credits_quantize(Decimal(gpus) * Decimal(max(0, seconds)) / Decimal(3600) * rate)


def job_rate(job: Job) -> Decimal:
    """Credits per GPU-hour of `job`: its queue's rate, the admin's share of it for a job
    that may be preempted (where the engine preempts: agents mode)."""
    rate: Decimal = job.queue.credit_rate
    if job.preemptible and executor.portal_schedules():
        share = Decimal(CreditPolicy.current().preemptible_rate_pct) / Decimal(100)
        rate = (rate * share).quantize(Decimal("0.001"))
    return rate


def _job_cost(job: Job, until: datetime, started: datetime | None = None) -> Decimal:
    """GPU-hours from the run's start (the job's, unless given) to `until`, times its rate."""
    started = started or job.started_at
    assert started is not None
    seconds = int((until - started).total_seconds())
    return gpu_cost(gpus=job.gpus, seconds=seconds, rate=job_rate(job))


def _cost_note(job: Job, until: datetime, started: datetime | None = None) -> str:
    started = started or job.started_at
    assert started is not None
    hours = max(0.0, (until - started).total_seconds() / 3600)
    return f"{job.gpus} GPU × {hours:.3f} h × {job_rate(job)}/GPU-h"


def charged_for_run(run_tag: str) -> Decimal:
    """What the run under `run_tag` has been charged so far (a positive number)."""
    total = LedgerEntry.objects.filter(
        kind=LedgerEntry.Kind.CHARGE, idempotency_key__startswith=run_tag + ":"
    ).aggregate(s=Sum("amount"))["s"]
    return -(total or ZERO)


def _taken_for_run(job: Job) -> Decimal:
    """What this run of the job has been charged so far (a positive number)."""
    return charged_for_run(_run_tag(job))


def charge_window_floor(now: datetime, minutes: int) -> datetime:
    """The start of the charging window `now` falls in (windows of `minutes`, from the epoch)."""
    step = minutes * 60
    return datetime.fromtimestamp(int(now.timestamp()) // step * step, tz=UTC)


def credits_charge_running_jobs(*, now: datetime | None = None) -> int:
    """Charge every running job up to the current charging window; returns how many were charged.

    The window's end is both the amount's limit and the idempotency key, so a
    re-delivered or overlapping run charges nothing twice.
    """
    now = now or timezone.now()
    upto = charge_window_floor(now, CreditPolicy.current().charge_interval_minutes)
    job_ids = Job.objects.filter(
        state=Job.State.RUNNING, started_at__isnull=False, started_at__lt=upto
    ).values_list("id", flat=True)
    return sum(1 for job_id in list(job_ids) if _charge_job_upto(job_id=job_id, upto=upto))


@transaction.atomic
def _charge_job_upto(*, job_id: int, upto: datetime) -> bool:
    owner_id = Job.objects.filter(pk=job_id).values_list("owner_id", flat=True).first()
    if owner_id is None:
        return False
    account_locked(User.objects.get(pk=owner_id))
    # Read the job after taking the lock: a settlement that ran meanwhile wins.
    job = Job.objects.select_related("queue", "owner").get(pk=job_id)
    if job.state != Job.State.RUNNING or job.started_at is None:
        return False
    owed = _job_cost(job, upto) - _taken_for_run(job)
    if owed <= 0:
        return False
    ledger_entry_post(
        user=job.owner,
        amount=-owed,
        kind=LedgerEntry.Kind.CHARGE,
        idempotency_key=f"{_run_tag(job)}:upto:{upto.isoformat()}",
        job=job,
        note=_cost_note(job, upto),
        watch_thresholds=True,
    )
    return True


# A job's end settles its credits right after its commit (the ``job_ended`` signal, see credits/receivers.py); the
# sweep below makes up any settle lost on the way (a worker killed after the commit, a
# failure), once this long has passed, for jobs that ended within SETTLE_SWEEP_WINDOW_S.
SETTLE_SWEEP_GRACE_S = 60
SETTLE_SWEEP_WINDOW_S = 7 * 86400


def credits_settle_ended_jobs(*, now: datetime | None = None) -> int:
    """Settle (or, if lost, refund) the recently ended jobs whose settle never happened.

    A settled job has its efficiency verdict (written by every settle); a refunded lost job
    its refund entry. Both services are idempotent under the owner's account lock, so a
    sweep that meets a settle running at the same moment charges nothing twice.
    Returns how many jobs it settled or refunded.
    """
    now = now or timezone.now()
    window = Job.objects.filter(
        ended_at__gte=now - timedelta(seconds=SETTLE_SWEEP_WINDOW_S),
        ended_at__lt=now - timedelta(seconds=SETTLE_SWEEP_GRACE_S),
    )
    unsettled = list(
        window.filter(
            state__in=[s for s in Job.FINAL_STATES if s != Job.State.LOST],
            started_at__isnull=False,
            efficiency__isnull=True,
        ).values_list("pk", flat=True)
    )
    charged = LedgerEntry.objects.filter(job=OuterRef("pk"), kind=LedgerEntry.Kind.CHARGE)
    refunded = LedgerEntry.objects.filter(job=OuterRef("pk"), kind=LedgerEntry.Kind.REFUND)
    unrefunded = list(
        window.filter(state=Job.State.LOST)
        .filter(Exists(charged))
        .exclude(Exists(refunded))
        .values_list("pk", "end_reason")
    )
    for job_id in unsettled:
        credits_settle_job(job_id=job_id)
    for job_id, reason in unrefunded:
        credits_refund_job(job_id=job_id, reason=reason or gettext_noop("system failure"))
    if unsettled or unrefunded:
        log.warning(
            "settled %d and refunded %d ended job(s) whose settle had not happened",
            len(unsettled),
            len(unrefunded),
        )
    return len(unsettled) + len(unrefunded)


@transaction.atomic
def credits_settle_job(*, job_id: int) -> None:
    """Reconcile a finished job's charge and judge its efficiency; safe to call repeatedly.

    A lost job is refunded instead. A job that never started costs nothing.
    """
    job = Job.objects.select_related("queue", "owner").filter(pk=job_id).first()
    if job is None:
        log.warning("credits_settle_job: job %s does not exist", job_id)
        return
    if job.state == Job.State.LOST:
        credits_refund_job(job_id=job_id, reason=job.end_reason or "lost")
        return
    if job.state not in Job.FINAL_STATES or job.started_at is None:
        return
    account_locked(job.owner)
    ended = job.ended_at or timezone.now()
    final_key = f"{_run_tag(job)}:final"
    if not LedgerEntry.objects.filter(idempotency_key=final_key).exists():
        owed = _job_cost(job, ended) - _taken_for_run(job)
        if owed != 0:
            ledger_entry_post(
                user=job.owner,
                amount=-owed,
                kind=LedgerEntry.Kind.CHARGE,
                idempotency_key=final_key,
                job=job,
                note=_cost_note(job, ended),
                watch_thresholds=True,
            )
    if not JobEfficiency.objects.filter(job=job).exists():
        _judge_efficiency(job, ended)


@transaction.atomic
def credits_settle_preempted_run(*, job_id: int, started_at: datetime, until: datetime) -> None:
    """Charge a preempted run, now back in the queue, for its GPUs from `started_at` to
    `until` at the job's rate, less what the running charges already took; idempotent.

    Its next run is a new run (``_run_tag``) and is charged from zero."""
    job = Job.objects.select_related("queue", "owner").filter(pk=job_id).first()
    if job is None:
        return
    account_locked(job.owner)
    tag = _run_tag_at(job.pk, started_at)
    key = f"{tag}:preempted"
    if LedgerEntry.objects.filter(idempotency_key=key).exists():
        return
    owed = _job_cost(job, until, started_at) - charged_for_run(tag)
    if owed == 0:
        return
    ledger_entry_post(
        user=job.owner,
        amount=-owed,
        kind=LedgerEntry.Kind.CHARGE,
        idempotency_key=key,
        job=job,
        note=f"{_cost_note(job, until, started_at)} (preempted)",
        watch_thresholds=True,
    )


def _mean_utilisation(job: Job, ended: datetime) -> tuple[float | None, int]:
    """The mean GPU utilisation of the job's samples, and how many there were."""
    agg = GpuSample.objects.filter(
        job_id=job.pk, util_pct__isnull=False, ts__gte=job.started_at, ts__lte=ended
    ).aggregate(mean=Avg("util_pct"), n=Count("id"))
    return agg["mean"], agg["n"] or 0


def _judge_efficiency(job: Job, ended: datetime) -> None:
    policy = CreditPolicy.current()
    mean, samples = _mean_utilisation(job, ended)
    charged = -(
        LedgerEntry.objects.filter(job=job, kind=LedgerEntry.Kind.CHARGE).aggregate(
            s=Sum("amount")
        )["s"]
        or ZERO
    )
    if mean is None:
        verdict = JobEfficiency.Verdict.UNKNOWN
    elif mean >= policy.efficiency_threshold_pct:
        verdict = JobEfficiency.Verdict.REWARDED
        reward = credits_quantize(charged * policy.efficiency_reward_share)
        if reward > 0:
            ledger_entry_post(
                user=job.owner,
                amount=reward,
                kind=LedgerEntry.Kind.REWARD,
                idempotency_key=f"job:{job.pk}:reward",
                job=job,
                note=f"{mean:.1f}% ≥ {policy.efficiency_threshold_pct:g}%",
                watch_thresholds=False,
            )
    elif mean < policy.idle_threshold_pct:
        verdict = JobEfficiency.Verdict.IDLE
    else:
        verdict = JobEfficiency.Verdict.ORDINARY
    try:
        with transaction.atomic():
            JobEfficiency.objects.create(
                job=job, mean_util_pct=mean, sample_count=samples, verdict=verdict
            )
    except IntegrityError:
        return
    if verdict == JobEfficiency.Verdict.IDLE:
        with in_language_of(job.owner):
            notify(
                user=job.owner,
                kind="job_idle",
                title=_("Job #%(id)s sat idle on its GPUs") % {"id": job.pk},
                body=_(
                    "Job #%(id)s used its GPUs at %(util).1f%% on average. Idle GPUs keep "
                    "others waiting: please check that the job really uses the GPU, or "
                    "use the debug queue for interactive work."
                )
                % {"id": job.pk, "util": mean},
                url=portal_url("job_detail", job.pk),
                dedupe_key=f"job:{job.pk}:idle",
            )


@transaction.atomic
def credits_refund_job(*, job_id: int, reason: str) -> None:
    """Give back everything a job was charged (less rewards), once: it was lost through the system."""
    job = Job.objects.select_related("owner").filter(pk=job_id).first()
    if job is None:
        log.warning("credits_refund_job: job %s does not exist", job_id)
        return
    account_locked(job.owner)
    net = (
        LedgerEntry.objects.filter(
            job=job,
            kind__in=[LedgerEntry.Kind.CHARGE, LedgerEntry.Kind.REWARD, LedgerEntry.Kind.REFUND],
        ).aggregate(s=Sum("amount"))["s"]
        or ZERO
    )
    if net >= 0:
        return
    ledger_entry_post(
        user=job.owner,
        amount=-net,
        kind=LedgerEntry.Kind.REFUND,
        idempotency_key=f"job:{job.pk}:refund",
        job=job,
        note=str(reason or gettext_noop("system failure"))[:300],
        note_params={},
        watch_thresholds=False,
    )

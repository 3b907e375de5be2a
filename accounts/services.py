"""Credits and notifications: the append-only ledger, charging, grants, rewards and refunds.

Every function that moves credits goes through `_post`, which locks the member's
account row (SELECT … FOR UPDATE on PostgreSQL; SQLite serialises writers with
BEGIN IMMEDIATE), writes one LedgerEntry and moves the cached balance with F() in
the same transaction. An idempotency key makes every posting safe to repeat.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from functools import partial
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import Avg, Count, Exists, F, OuterRef, Sum
from django.urls import NoReverseMatch, reverse
from django.utils import timezone, translation
from django.utils.functional import Promise
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from accounts.errors import InvalidAmount, InvalidMonth, UnknownLedgerKind
from accounts.models import (
    CREDIT_QUANTUM,
    CreditAccount,
    CreditPolicy,
    JobEfficiency,
    LedgerEntry,
    Notification,
    User,
)

if TYPE_CHECKING:
    from jobqueue.models import Job

log = logging.getLogger(__name__)

ZERO = Decimal("0")


# --- Notifications ------------------------------------------------------------


@contextmanager
def in_language_of(user: User) -> Iterator[None]:
    """Texts stored for a member are written in the member's language."""
    with translation.override(user.preferred_language or settings.LANGUAGE_CODE):
        yield


def absolute_url(path: str) -> str:
    """A link for an email: the portal's path on the configured site URL (SITE_URL)."""
    if path.startswith(("http://", "https://")):
        return path
    return f"{settings.LABPORTAL_SITE_URL}{path}"


def _url(name: str, *args: Any) -> str:
    try:
        return reverse(name, args=args)
    except NoReverseMatch:  # the page is not mounted (e.g. in a partial deployment)
        return ""


def notify(
    *,
    user: User,
    kind: str,
    title: str | Promise,
    body: str | Promise = "",
    url: str = "",
    email: bool = True,
    dedupe_key: str | None = None,
) -> Notification:
    """Tell `user` something, under the bell and (after commit) by email.

    Lazy strings are rendered in the member's language. With a `dedupe_key` the same
    notification is created once per user however often the caller runs.
    """
    if dedupe_key:
        existing = Notification.objects.filter(user=user, dedupe_key=dedupe_key).first()
        if existing is not None:
            return existing
    with in_language_of(user):
        title_text, body_text = str(title)[:200], str(body)
    try:
        with transaction.atomic():
            notification = Notification.objects.create(
                user=user,
                kind=kind[:40],
                title=title_text,
                body=body_text,
                url=url,
                dedupe_key=dedupe_key or "",
            )
    except IntegrityError:
        return Notification.objects.get(user=user, dedupe_key=dedupe_key)
    if email and user.email:
        transaction.on_commit(partial(_enqueue_notification_email, notification.pk))
    return notification


def _enqueue_notification_email(notification_id: int) -> None:
    """Hand the email to its own task, so the caller (e.g. a job's end) never waits for SMTP.

    If the broker cannot take the message, the email is sent here instead: none is lost.
    """
    from accounts.tasks import notification_email_task

    try:
        notification_email_task.apply_async(args=[notification_id])
    except Exception:  # broker away: sending inline is slower but loses nothing
        log.exception(
            "could not enqueue the email of notification %s; sending it now", notification_id
        )
        notification_email_send(notification_id)


def notification_email_send(notification_id: int) -> None:
    """Email one notification once; a mail failure is logged and never undoes the notification."""
    notification = Notification.objects.select_related("user").filter(pk=notification_id).first()
    if notification is None or notification.emailed_at is not None:
        return
    link = f"\n\n{absolute_url(notification.url)}" if notification.url else ""
    try:
        send_mail(
            subject=f"[LabPortal] {notification.title}",
            message=f"{notification.body}{link}",
            from_email=None,
            recipient_list=[notification.user.email],
        )
    except Exception:  # SMTP errors come in many types; the in-app copy is kept either way
        log.exception("could not email notification %s", notification_id)
        return
    Notification.objects.filter(pk=notification_id).update(emailed_at=timezone.now())


def notifications_mark_read(*, user: User, notification_ids: list[int] | None = None) -> int:
    """Mark the member's notifications read (all unread ones when no ids are given)."""
    qs = Notification.objects.for_user(user).unread()
    if notification_ids is not None:
        qs = qs.filter(pk__in=notification_ids)
    return qs.update(read_at=timezone.now())


# --- The ledger -----------------------------------------------------------------


def _quantize(value: Decimal) -> Decimal:
    return value.quantize(CREDIT_QUANTUM, rounding=ROUND_HALF_UP)


def _account_locked(user: User) -> CreditAccount:
    """The member's account, created if missing, locked for the rest of the transaction."""
    account, _created = CreditAccount.objects.get_or_create(user=user)
    return CreditAccount.objects.select_for_update().get(pk=account.pk)


def credit_account_for(user: User) -> CreditAccount:
    """The member's account (created empty on first use)."""
    account, _created = CreditAccount.objects.get_or_create(user=user)
    return account


def ledger_post(
    *,
    user: User,
    amount: Decimal,
    kind: str,
    idempotency_key: str,
    job: Job | None = None,
    reservation: Any = None,
    note: str = "",
    note_params: dict[str, Any] | None = None,
    created_by: User | None = None,
) -> LedgerEntry:
    """Append one entry and move the balance by `amount` (negative spends).

    The same idempotency key twice posts once and returns the first entry. Crossing
    the low-credit threshold or zero notifies the member.
    """
    return _post(
        user=user,
        amount=amount,
        kind=kind,
        idempotency_key=idempotency_key,
        job=job,
        reservation=reservation,
        note=note,
        note_params=note_params,
        created_by=created_by,
        watch_thresholds=True,
    )


@transaction.atomic
def _post(
    *,
    user: User,
    amount: Decimal,
    kind: str,
    idempotency_key: str,
    job: Job | None = None,
    reservation: Any = None,
    note: str = "",
    note_params: dict[str, Any] | None = None,
    created_by: User | None = None,
    watch_thresholds: bool,
) -> LedgerEntry:
    # `note` is an untranslated msgid when `note_params` is given (even empty): it is
    # stored in English and shown in each reader's language.
    note_i18n: dict[str, Any] = {}
    if note_params is not None:
        params = {k: v if isinstance(v, int | float) else str(v) for k, v in note_params.items()}
        note_i18n = {"msgid": note, "params": params}
        note = note % params if params else note
    _check_kind(kind)
    if isinstance(amount, float) or not isinstance(amount, Decimal | int):
        raise InvalidAmount(
            _("Amounts of credit must be given as a Decimal, e.g. Decimal('12.5').")
        )
    if not idempotency_key:
        raise InvalidAmount(_("Every ledger entry needs an idempotency key."))
    amount = _quantize(Decimal(amount))
    existing = LedgerEntry.objects.filter(idempotency_key=idempotency_key).first()
    if existing is not None:
        return existing
    account = _account_locked(user)
    # A concurrent poster of the same key may have committed while we waited for the lock.
    existing = LedgerEntry.objects.filter(idempotency_key=idempotency_key).first()
    if existing is not None:
        return existing
    before = account.balance
    try:
        with transaction.atomic():
            entry = LedgerEntry.objects.create(
                account=account,
                kind=kind,
                amount=amount,
                balance_after=before + amount,
                idempotency_key=idempotency_key,
                job=job,
                reservation=reservation,
                note=note[:300],
                note_i18n=note_i18n,
                created_by=created_by,
            )
    except IntegrityError:
        return LedgerEntry.objects.get(idempotency_key=idempotency_key)
    CreditAccount.objects.filter(pk=account.pk).update(balance=F("balance") + amount)
    if watch_thresholds:
        _warn_on_threshold(user, before, before + amount)
    return entry


def _check_kind(kind: str) -> None:
    if kind not in LedgerEntry.Kind.values:
        raise UnknownLedgerKind(
            _("“%(kind)s” is not a ledger kind; use one of: %(kinds)s.")
            % {"kind": kind, "kinds": ", ".join(LedgerEntry.Kind.values)}
        )


@dataclass(frozen=True)
class Posting:
    """One entry of a batch posted with ``ledger_post_batch``."""

    amount: Decimal
    kind: str
    idempotency_key: str
    note: str = ""
    job_id: int | None = None


@transaction.atomic
def ledger_post_batch(*, user: User, postings: Sequence[Posting]) -> int:
    """Append many entries for one member in one go (one lock, one balance move, one warning).

    The same rules as ``ledger_post``: keys already posted are skipped, so a repeated
    batch posts nothing twice. Returns how many entries were written.
    """
    for posting in postings:
        _check_kind(posting.kind)
        if not isinstance(posting.amount, Decimal) or not posting.idempotency_key:
            raise InvalidAmount(
                _("Amounts of credit must be given as a Decimal, e.g. Decimal('12.5').")
            )
    if not postings:
        return 0
    account = _account_locked(user)
    keys = [p.idempotency_key for p in postings]
    posted = set(
        LedgerEntry.objects.filter(idempotency_key__in=keys).values_list(
            "idempotency_key", flat=True
        )
    )
    balance = account.balance
    rows = []
    for posting in postings:
        if posting.idempotency_key in posted:
            continue
        posted.add(posting.idempotency_key)
        amount = _quantize(posting.amount)
        balance += amount
        rows.append(
            LedgerEntry(
                account=account,
                kind=posting.kind,
                amount=amount,
                balance_after=balance,
                idempotency_key=posting.idempotency_key,
                job_id=posting.job_id,
                note=posting.note[:300],
            )
        )
    LedgerEntry.objects.bulk_create(rows)
    CreditAccount.objects.filter(pk=account.pk).update(
        balance=F("balance") + (balance - account.balance)
    )
    _warn_on_threshold(user, account.balance, balance)
    return len(rows)


def next_grant_date(today: date | None = None) -> date:
    """The 1st of the next month: when the next monthly grant comes."""
    today = today or timezone.localdate()
    return date(today.year + today.month // 12, today.month % 12 + 1, 1)


def _warn_on_threshold(user: User, before: Decimal, after: Decimal) -> None:
    if after >= before:
        return
    policy = CreditPolicy.current()
    with in_language_of(user):
        next_grant = next_grant_date()
        if before > 0 >= after:
            notify(
                user=user,
                kind="credits_zero",
                title=_("You are out of credits"),
                body=_(
                    "Your credit balance is now %(balance)s. Your running jobs keep running "
                    "and new jobs still queue, but they start after the jobs of members who "
                    "still have credits. Your next grant comes on %(date)s."
                )
                % {"balance": after, "date": next_grant.isoformat()},
                url=_url("credits"),
            )
        elif before > policy.low_credit_threshold >= after > 0:
            notify(
                user=user,
                kind="credits_low",
                title=_("Your credits are running low"),
                body=_(
                    "Your credit balance is now %(balance)s. When it reaches zero your jobs "
                    "still run, but after the jobs of members who have credits. Your next "
                    "grant comes on %(date)s."
                )
                % {"balance": after, "date": next_grant.isoformat()},
                url=_url("credits"),
            )


# --- Charging jobs ------------------------------------------------------------------


def _job_model() -> Any:
    return apps.get_model("jobqueue", "Job")


def _run_tag(job: Job) -> str:
    """Charges are counted per run, so a requeued job's new run starts from zero."""
    assert job.started_at is not None
    return f"job:{job.pk}:run:{int(job.started_at.timestamp())}"


def gpu_cost(*, gpus: int, seconds: int, rate: Decimal) -> Decimal:
    """GPU-hours times the rate, to the credit quantum (agents mode and Slurm mode alike)."""
    return _quantize(Decimal(gpus) * Decimal(max(0, seconds)) / Decimal(3600) * rate)


def _job_cost(job: Job, until: datetime) -> Decimal:
    """GPU-hours from the job's start to `until`, times its queue's rate."""
    assert job.started_at is not None
    seconds = int((until - job.started_at).total_seconds())
    return gpu_cost(gpus=job.gpus, seconds=seconds, rate=job.queue.credit_rate)


def _cost_note(job: Job, until: datetime) -> str:
    assert job.started_at is not None
    hours = max(0.0, (until - job.started_at).total_seconds() / 3600)
    return f"{job.gpus} GPU × {hours:.3f} h × {job.queue.credit_rate}/GPU-h"


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
    Job = _job_model()
    job_ids = Job.objects.filter(
        state=Job.State.RUNNING, started_at__isnull=False, started_at__lt=upto
    ).values_list("id", flat=True)
    return sum(1 for job_id in list(job_ids) if _charge_job_upto(job_id=job_id, upto=upto))


@transaction.atomic
def _charge_job_upto(*, job_id: int, upto: datetime) -> bool:
    Job = _job_model()
    owner_id = Job.objects.filter(pk=job_id).values_list("owner_id", flat=True).first()
    if owner_id is None:
        return False
    _account_locked(User.objects.get(pk=owner_id))
    # Read the job after taking the lock: a settlement that ran meanwhile wins.
    job = Job.objects.select_related("queue", "owner").get(pk=job_id)
    if job.state != Job.State.RUNNING or job.started_at is None:
        return False
    owed = _job_cost(job, upto) - _taken_for_run(job)
    if owed <= 0:
        return False
    _post(
        user=job.owner,
        amount=-owed,
        kind=LedgerEntry.Kind.CHARGE,
        idempotency_key=f"{_run_tag(job)}:upto:{upto.isoformat()}",
        job=job,
        note=_cost_note(job, upto),
        watch_thresholds=True,
    )
    return True


# A job's end settles its credits right after its commit (jobqueue's ``_after_final``); the
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
    Job = _job_model()
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
    Job = _job_model()
    job = Job.objects.select_related("queue", "owner").filter(pk=job_id).first()
    if job is None:
        log.warning("credits_settle_job: job %s does not exist", job_id)
        return
    if job.state == Job.State.LOST:
        credits_refund_job(job_id=job_id, reason=job.end_reason or "lost")
        return
    if job.state not in Job.FINAL_STATES or job.started_at is None:
        return
    _account_locked(job.owner)
    ended = job.ended_at or timezone.now()
    final_key = f"{_run_tag(job)}:final"
    if not LedgerEntry.objects.filter(idempotency_key=final_key).exists():
        owed = _job_cost(job, ended) - _taken_for_run(job)
        if owed != 0:
            _post(
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


def _mean_utilisation(job: Job, ended: datetime) -> tuple[float | None, int]:
    """The mean GPU utilisation of the job's samples, and how many there were."""
    try:
        GpuSample = apps.get_model("telemetry", "GpuSample")
    except LookupError:
        return None, 0
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
        reward = _quantize(charged * policy.efficiency_reward_share)
        if reward > 0:
            _post(
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
                url=_url("job_detail", job.pk),
                dedupe_key=f"job:{job.pk}:idle",
            )


@transaction.atomic
def credits_refund_job(*, job_id: int, reason: str) -> None:
    """Give back everything a job was charged (less rewards), once: it was lost through the system."""
    Job = _job_model()
    job = Job.objects.select_related("owner").filter(pk=job_id).first()
    if job is None:
        log.warning("credits_refund_job: job %s does not exist", job_id)
        return
    _account_locked(job.owner)
    net = (
        LedgerEntry.objects.filter(
            job=job,
            kind__in=[LedgerEntry.Kind.CHARGE, LedgerEntry.Kind.REWARD, LedgerEntry.Kind.REFUND],
        ).aggregate(s=Sum("amount"))["s"]
        or ZERO
    )
    if net >= 0:
        return
    _post(
        user=job.owner,
        amount=-net,
        kind=LedgerEntry.Kind.REFUND,
        idempotency_key=f"job:{job.pk}:refund",
        job=job,
        note=str(reason or gettext_noop("system failure"))[:300],
        note_params={},
        watch_thresholds=False,
    )


# --- The monthly grant --------------------------------------------------------------


def credits_monthly_grant(*, month: date | None = None) -> int:
    """Give every active, approved member this month's grant (base × category multiplier).

    Unused credit is first cut to what the carry-over setting keeps. Running it again
    in the same month grants nobody twice. Returns how many members were granted.
    """
    if month is not None and not isinstance(month, date):
        raise InvalidMonth(_("The month must be a date, e.g. 2025-03-01."))
    first = (month or timezone.localdate()).replace(day=1)
    policy = CreditPolicy.current()
    members = User.objects.filter(is_active=True, approval=User.Approval.APPROVED).select_related(
        "category"
    )
    return sum(
        1 for user in members.iterator() if _grant_month(user=user, first=first, policy=policy)
    )


@transaction.atomic
def _grant_month(*, user: User, first: date, policy: CreditPolicy) -> bool:
    key = f"grant:{first:%Y-%m}:user:{user.pk}"
    if LedgerEntry.objects.filter(idempotency_key=key).exists():
        return False
    account = _account_locked(user)
    if LedgerEntry.objects.filter(idempotency_key=key).exists():
        return False
    kept = policy.carried_over(account.balance)
    if kept != account.balance:
        _post(
            user=user,
            amount=kept - account.balance,
            kind=LedgerEntry.Kind.EXPIRY,
            idempotency_key=f"expiry:{first:%Y-%m}:user:{user.pk}",
            note=gettext_noop("Unused credit beyond the carry-over rule (%(rule)s)"),
            note_params={"rule": policy.carry_over},
            watch_thresholds=False,
        )
    amount = policy.grant_for(user)
    _post(
        user=user,
        amount=amount,
        kind=LedgerEntry.Kind.GRANT,
        idempotency_key=key,
        note=f"{first:%Y-%m}",
        watch_thresholds=False,
    )
    with in_language_of(user):
        notify(
            user=user,
            kind="credits_grant",
            title=_("Your monthly credits have arrived"),
            body=_(
                "You received %(amount)s credits for %(month)s. Your balance is now %(balance)s."
            )
            % {"amount": amount, "month": f"{first:%Y-%m}", "balance": kept + amount},
            url=_url("credits"),
            dedupe_key=key,
        )
    return True

"""Credits and notifications: the append-only ledger and the monthly grant (charging jobs
is credits/services.py).

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
from datetime import date, datetime
from decimal import ROUND_HALF_UP, Decimal
from functools import partial
from typing import Any

from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import F, QuerySet
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
    LedgerEntry,
    Notification,
    User,
)
from core.i18n import lazy_text, rendered, stored_form

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


def portal_url(name: str, *args: Any) -> str:
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
                title_message=stored_form(title) if isinstance(title, Promise) else None,
                body_message=stored_form(body) if isinstance(body, Promise) else None,
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
    with in_language_of(notification.user):  # the recipient's language now
        title, body = notification.local_title, notification.local_body
    try:
        send_mail(
            subject=f"[LabPortal] {title}",
            message=f"{body}{link}",
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


def credits_quantize(value: Decimal) -> Decimal:
    return value.quantize(CREDIT_QUANTUM, rounding=ROUND_HALF_UP)


def account_locked(user: User) -> CreditAccount:
    """The member's account, created if missing, locked for the rest of the transaction."""
    account, _created = CreditAccount.objects.get_or_create(user=user)
    return CreditAccount.objects.select_for_update().get(pk=account.pk)


def ledger_post(
    *,
    user: User,
    amount: Decimal,
    kind: str,
    idempotency_key: str,
    job: Any = None,
    reservation: Any = None,
    note: str = "",
    note_params: dict[str, Any] | None = None,
    created_by: User | None = None,
) -> LedgerEntry:
    """Append one entry and move the balance by `amount` (negative spends).

    The same idempotency key twice posts once and returns the first entry. Crossing
    the low-credit threshold or zero notifies the member.
    """
    return ledger_entry_post(
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
def ledger_entry_post(
    *,
    user: User,
    amount: Decimal,
    kind: str,
    idempotency_key: str,
    job: Any = None,
    reservation: Any = None,
    note: str = "",
    note_params: dict[str, Any] | None = None,
    created_by: User | None = None,
    watch_thresholds: bool,
) -> LedgerEntry:
    # `note` is an untranslated msgid when `note_params` is given (even empty): it is
    # stored in English and shown in each reader's language; a moment among the parameters
    # is kept as a moment and read in the reader's date format and the lab's time zone.
    note_i18n: dict[str, Any] = {}
    if note_params is not None:
        params = {
            k: stored_form(v)
            if isinstance(v, datetime)
            else v
            if isinstance(v, int | float)
            else str(v)
            for k, v in note_params.items()
        }
        note_i18n = {"msgid": note, "params": params}
        with translation.override("en"):
            note = note % {k: rendered(v) for k, v in params.items()} if params else note
    _check_kind(kind)
    if isinstance(amount, float) or not isinstance(amount, Decimal | int):
        raise InvalidAmount(
            _("Amounts of credit must be given as a Decimal, e.g. Decimal('12.5').")
        )
    if not idempotency_key:
        raise InvalidAmount(_("Every ledger entry needs an idempotency key."))
    amount = credits_quantize(Decimal(amount))
    existing = LedgerEntry.objects.filter(idempotency_key=idempotency_key).first()
    if existing is not None:
        return existing
    account = account_locked(user)
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
    account = account_locked(user)
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
        amount = credits_quantize(posting.amount)
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
                url=portal_url("credits"),
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
                url=portal_url("credits"),
            )


# --- The monthly grant --------------------------------------------------------------


def credits_monthly_grant(*, month: date | None = None) -> int:
    """Give every active, approved member this month's grant (base × category multiplier).

    Unused credit is first cut to what the carry-over setting keeps. Running it again
    in the same month grants nobody twice. Returns how many members were granted.
    """
    if month is not None and not isinstance(month, date):
        raise InvalidMonth(_("The month must be a date, e.g. 2025-03-01."))
    return _grant_members(User.objects.all(), first=(month or timezone.localdate()).replace(day=1))


def credits_grant_joined(user_ids: Sequence[int]) -> int:
    """This month's grant, at once, for members who just joined or were just approved
    (the hourly pass would give it within the hour; until then a Slurm member at zero
    credit is niced). Members who already have it, inactive or pending ones get nothing.
    Returns how many were granted."""
    members = User.objects.filter(pk__in=list(user_ids))
    return _grant_members(members, first=timezone.localdate().replace(day=1))


def _grant_members(users: QuerySet[User], *, first: date) -> int:
    """The month's grant for the active, approved members among ``users``."""
    policy = CreditPolicy.current()
    members = users.filter(is_active=True, approval=User.Approval.APPROVED)
    return sum(
        1
        for user in members.select_related("category").iterator()
        if _grant_month(user=user, first=first, policy=policy)
    )


def grant_when_committed(user_ids: Sequence[int]) -> None:
    """credits_grant_joined once the transaction that made the members commits; a failure
    is logged (the hourly pass grants them), never the request's."""
    ids = list(user_ids)
    if ids:
        transaction.on_commit(partial(credits_grant_joined, ids), robust=True)


@transaction.atomic
def _grant_month(*, user: User, first: date, policy: CreditPolicy) -> bool:
    key = f"grant:{first:%Y-%m}:user:{user.pk}"
    if LedgerEntry.objects.filter(idempotency_key=key).exists():
        return False
    account = account_locked(user)
    if LedgerEntry.objects.filter(idempotency_key=key).exists():
        return False
    kept = policy.carried_over(account.balance)
    if kept != account.balance:
        ledger_entry_post(
            user=user,
            amount=kept - account.balance,
            kind=LedgerEntry.Kind.EXPIRY,
            idempotency_key=f"expiry:{first:%Y-%m}:user:{user.pk}",
            note=gettext_noop("Unused credit beyond the carry-over rule (%(rule)s)"),
            note_params={"rule": policy.carry_over},
            watch_thresholds=False,
        )
    amount = policy.grant_for(user)
    ledger_entry_post(
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
            title=lazy_text(gettext_noop("Your monthly credits have arrived")),
            body=lazy_text(
                gettext_noop(
                    "You received %(amount)s credits for %(month)s. Your balance is now "
                    "%(balance)s."
                ),
                amount=amount,
                month=f"{first:%Y-%m}",
                balance=kept + amount,
            ),
            url=portal_url("credits"),
            dedupe_key=key,
        )
    return True

"""People: users, their categories and their personal access tokens."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import connection, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import functions as db_functions
from django.db.transaction import TransactionManagementError
from django.utils import timezone
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from core.i18n import in_reader_language, rendered
from core.models import HashedToken


class Category(models.Model):
    """A kind of member ("PhD, thesis phase", "Master", ...) with its own rules."""

    name = models.CharField(_("name"), max_length=80, unique=True)
    description = models.TextField(_("description"), blank=True)
    # The English name stays the category's identifier (directory group mappings, Slurm
    # accounts, metrics); the Chinese one is only shown.
    name_zh_hans = models.CharField(
        _("name in Chinese"),
        max_length=80,
        blank=True,
        help_text=_("Shown to readers of the Chinese pages; empty: they see the English name."),
    )
    description_zh_hans = models.TextField(
        _("description in Chinese"),
        blank=True,
        help_text=_(
            "Shown to readers of the Chinese pages; empty: they see the English description."
        ),
    )
    fairshare_weight = models.PositiveIntegerField(
        _("fair-share weight"),
        default=10,
        validators=[MinValueValidator(1)],
        help_text=_("Shares of this category in the lab's share tree."),
    )
    credit_multiplier = models.DecimalField(
        _("credit multiplier"),
        max_digits=5,
        decimal_places=2,
        default=Decimal("1.00"),
        validators=[MinValueValidator(Decimal("0"))],
        help_text=_("The monthly grant is the base grant times this."),
    )
    priority_factor = models.FloatField(
        _("priority factor"),
        default=0.5,
        validators=[MinValueValidator(0.0)],
        help_text=_("The category factor of the multifactor priority, between 0 and 1."),
    )
    max_concurrent_gpus = models.PositiveIntegerField(_("max concurrent GPUs"), default=8)
    max_queued_jobs = models.PositiveIntegerField(_("max queued jobs"), default=50)
    max_booked_hours_per_week = models.PositiveIntegerField(
        _("max booked GPU-hours per week"), default=48
    )
    max_booking_days_ahead = models.PositiveIntegerField(
        _("how many days ahead a member may book"), default=14
    )

    class Meta:
        verbose_name = _("category")
        verbose_name_plural = _("categories")
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(priority_factor__gte=0) & models.Q(priority_factor__lte=1),
                name="category_priority_factor_0_1",
                violation_error_message=_(
                    "The priority factor is a share from 0 to 1 (e.g. 0.5 halves the "
                    "category's priority)."
                ),
            ),
        ]

    def __str__(self) -> str:
        return self.local_name

    @property
    def local_name(self) -> str:
        """The name in the reader's language, falling back to the English one."""
        return in_reader_language(self.name, self.name_zh_hans)

    @property
    def local_description(self) -> str:
        """The description in the reader's language, falling back to the other one."""
        return in_reader_language(self.description, self.description_zh_hans)


class User(AbstractUser):
    """A lab member or admin. Custom from the first migration."""

    class Approval(models.TextChoices):
        APPROVED = "approved", _("approved")
        PENDING = "pending", _("awaiting approval")
        REJECTED = "rejected", _("rejected")

    category = models.ForeignKey(
        Category,
        verbose_name=_("category"),
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="users",
    )
    approval = models.CharField(
        _("approval"), max_length=16, choices=Approval.choices, default=Approval.APPROVED
    )
    unix_uid = models.PositiveIntegerField(_("unix uid"), null=True, blank=True, unique=True)
    unix_gid = models.PositiveIntegerField(_("unix gid"), null=True, blank=True)
    preferred_language = models.CharField(
        _("language"), max_length=10, choices=settings.LANGUAGES, blank=True
    )
    notify_job_end = models.BooleanField(
        _("tell me when my jobs end"),
        default=True,
        help_text=_("A notification (and an email) when a job completes, fails or times out."),
    )

    class Meta(AbstractUser.Meta):  # type: ignore[name-defined]  # django-stubs does not declare AbstractUser.Meta
        swappable = "AUTH_USER_MODEL"

    @property
    def display_name(self) -> str:
        return self.get_full_name() or self.username

    def can_log_in(self) -> bool:
        return self.is_active and self.approval == self.Approval.APPROVED

    def lock_for_limits(self) -> None:
        """Hold this member's row until the transaction ends; taken before a limit is read,
        requests of one member that check a per-member limit (waiting jobs, weekly booked
        hours, pending requests, emergencies) run one after another, and none can pass a
        limit the others used up.

        The lock is PostgreSQL's FOR NO KEY UPDATE: rows that point at the member (a job, an
        event, a ledger entry) are still written by others without waiting for it. On SQLite
        the whole database is locked instead (transactions begin IMMEDIATE).
        """
        # Written out: a limit check runs on every submit, and building this query
        # through the ORM each time cost more than PostgreSQL's answering it.
        if not connection.in_atomic_block:
            raise TransactionManagementError(
                "select_for_update cannot be used outside of a transaction."
            )
        if connection.features.has_select_for_update:
            table = connection.ops.quote_name(User._meta.db_table)
            no_key = " NO KEY" if connection.features.has_select_for_no_key_update else ""
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT id FROM {table} WHERE id = %s FOR{no_key} UPDATE", [self.pk]
                )

    def ensure_unix_ids(self) -> tuple[int, int]:
        """The member's uid/gid for containers, allocated from the configured range if unset."""
        if self.unix_uid is None:
            highest = User.objects.aggregate(m=models.Max("unix_uid"))["m"]
            self.unix_uid = max(highest or 0, settings.LABPORTAL_UID_RANGE_START - 1) + 1
            self.unix_gid = self.unix_gid or self.unix_uid
            self.save(update_fields=["unix_uid", "unix_gid"])
        return self.unix_uid, self.unix_gid or self.unix_uid


class PersonalAccessTokenQuerySet(models.QuerySet["PersonalAccessToken"]):
    def usable(self) -> PersonalAccessTokenQuerySet:
        now = timezone.now()
        return self.filter(revoked_at__isnull=True).filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now)
        )


class PersonalAccessToken(HashedToken):
    """A token for the API and labctl. Only its SHA-256 is stored; the secret is shown once."""

    PREFIX = "lp_"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="access_tokens"
    )
    name = models.CharField(_("name"), max_length=80)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(_("expires"), null=True, blank=True)

    objects = PersonalAccessTokenQuerySet.as_manager()

    class Meta:
        verbose_name = _("personal access token")
        verbose_name_plural = _("personal access tokens")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.token_prefix}…)"

    @classmethod
    def issue(
        cls, *, user: User, name: str, lifetime: timedelta | None = None
    ) -> tuple[PersonalAccessToken, str]:
        """Create a token; returns it and the secret, which is never stored."""
        secret, stored = cls.new_secret()
        token = cls.objects.create(
            user=user,
            name=name,
            expires_at=timezone.now() + lifetime if lifetime else None,
            **stored,
        )
        return token, secret

    @classmethod
    def authenticate(cls, secret: str) -> PersonalAccessToken | None:
        """The usable token with this secret, with its user and category, or None.

        Every call reads the token, its user and the user's category afresh from the
        database (a revoked token, a deactivated member or a changed category count at
        once), in one statement whose text is built once per process and connection:
        Django's compiling of the same select_related query was about a fifth of the
        CPU of an API submit. It reads exactly what
        ``usable().select_related("user__category").filter(token_hash=…)`` does.
        """
        lookup = _token_lookup(connection)
        with connection.cursor() as cursor:
            # Bound as the ORM binds a DateTimeField (SQLite stores naive UTC text).
            now = connection.ops.adapt_datetimefield_value(timezone.now())
            cursor.execute(lookup.sql, [cls.hash_secret(secret), now])
            row = cursor.fetchone()
        if row is None:
            return None
        token, user, category = lookup.instances(row, connection)
        User.category.field.set_cached_value(user, category)
        PersonalAccessToken.user.field.set_cached_value(token, user)
        if not user.can_log_in():
            return None
        return token

    @property
    def is_usable(self) -> bool:
        return self.revoked_at is None and (
            self.expires_at is None or self.expires_at > timezone.now()
        )

    # "Last used" is shown to the member to the minute; a write (and its commit) on
    # every API call would halve what a script can submit per second.
    LAST_USED_RESOLUTION = timedelta(minutes=1)

    def touch(self) -> None:
        """Record a use, at most once per LAST_USED_RESOLUTION."""
        now = timezone.now()
        if self.last_used_at is None or now - self.last_used_at >= self.LAST_USED_RESOLUTION:
            self.last_used_at = now
            PersonalAccessToken.objects.filter(pk=self.pk).update(last_used_at=now)

    def revoke(self) -> None:
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at"])


class _TokenLookup:
    """The SQL of PersonalAccessToken.authenticate for one connection, and how to read its row."""

    def __init__(self, conn: BaseDatabaseWrapper) -> None:
        self.vendor = conn.vendor
        qn = conn.ops.quote_name
        self.parts: list[tuple[type[models.Model], list[str], list[tuple[list[Any], Any]]]] = []
        columns: list[str] = []
        for model, alias in ((PersonalAccessToken, "t"), (User, "u"), (Category, "c")):
            fields = list(model._meta.concrete_fields)
            converters = []
            for field in fields:
                col = field.get_col(alias)
                converters.append(
                    (conn.ops.get_db_converters(col) + field.get_db_converters(conn), col)  # type: ignore[attr-defined]
                )
                columns.append(f"{alias}.{qn(field.column)}")
            self.parts.append((model, [f.attname for f in fields], converters))
        token_fk = PersonalAccessToken._meta.get_field("user").column
        category_fk = User._meta.get_field("category").column
        self.sql = (
            f"SELECT {', '.join(columns)} "
            f"FROM {qn(PersonalAccessToken._meta.db_table)} t "
            f"INNER JOIN {qn(User._meta.db_table)} u ON t.{qn(token_fk)} = u.{qn('id')} "
            f"LEFT OUTER JOIN {qn(Category._meta.db_table)} c ON u.{qn(category_fk)} = c.{qn('id')} "
            f"WHERE t.{qn('token_hash')} = %s AND t.{qn('revoked_at')} IS NULL "
            f"AND (t.{qn('expires_at')} IS NULL OR t.{qn('expires_at')} > %s)"
        )

    def instances(
        self, row: tuple[Any, ...], conn: BaseDatabaseWrapper
    ) -> tuple[PersonalAccessToken, User, Category | None]:
        made: list[Any] = []
        start = 0
        for model, attnames, converters in self.parts:
            values = list(row[start : start + len(attnames)])
            start += len(attnames)
            if values[0] is None:  # no category: the LEFT JOIN's columns are all NULL
                made.append(None)
                continue
            for i, (convs, col) in enumerate(converters):
                for convert in convs:
                    values[i] = convert(values[i], col, conn)
            made.append(model.from_db(conn.alias, attnames, values))
        return made[0], made[1], made[2]


_token_lookups: dict[str, _TokenLookup] = {}


def _token_lookup(conn: BaseDatabaseWrapper) -> _TokenLookup:
    lookup = _token_lookups.get(conn.alias)
    if lookup is None or lookup.vendor != conn.vendor:
        lookup = _token_lookups[conn.alias] = _TokenLookup(conn)
    return lookup


# --- Projects -----------------------------------------------------------------


class ProjectQuerySet(models.QuerySet["Project"]):
    def open_to(self, user: User) -> ProjectQuerySet:
        """The active projects `user` may charge a job to: theirs as a member or as PI."""
        return (
            self.filter(active=True)
            .filter(models.Q(members=user) | models.Q(pi=user))
            .distinct()
            .order_by("name")
        )


class Project(models.Model):
    """A grant or shared project that jobs are charged to for accounting (Slurm's accounts,
    OpenPAI's virtual clusters): the usage report has a table per project. Credits are
    still the member's; a project only says what the GPU time was for."""

    name = models.SlugField(
        _("short name"),
        max_length=40,
        unique=True,
        help_text=_("What members type (labctl submit --project NAME): letters, digits, - and _."),
    )
    title = models.CharField(_("title"), max_length=200)
    title_zh_hans = models.CharField(_("Chinese title"), max_length=200, blank=True)
    pi = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("principal investigator"),
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="projects_led",
    )
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL,
        verbose_name=_("members"),
        related_name="projects",
        blank=True,
        help_text=_("Who may charge jobs to it (its PI always may)."),
    )
    grant_reference = models.CharField(
        _("grant reference"),
        max_length=120,
        blank=True,
        help_text=_("The funder's number for the grant, as the usage report shows it."),
    )
    active = models.BooleanField(
        _("active"),
        default=True,
        help_text=_("An ended project takes no new jobs; its history stays in the reports."),
    )

    objects = ProjectQuerySet.as_manager()

    class Meta:
        verbose_name = _("project")
        verbose_name_plural = _("projects")
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def display_title(self) -> str:
        return in_reader_language(self.title, self.title_zh_hans)

    def is_open_to(self, user: User) -> bool:
        return self.active and (self.pi_id == user.pk or self.members.filter(pk=user.pk).exists())


# --- Credits ------------------------------------------------------------------


class CreditPolicy(models.Model):
    """The lab's credit rules: one row, edited by admins in the admin panel."""

    class CarryOver(models.TextChoices):
        NONE = "none", _("none: unused credit expires at the month's end")
        CAPPED = "capped", _("capped: keep unused credit up to the cap")
        FULL = "full", _("full: keep all unused credit")

    base_grant = models.DecimalField(
        _("monthly base grant"),
        max_digits=12,
        decimal_places=3,
        default=Decimal("1000.000"),
        validators=[MinValueValidator(Decimal("0"))],
        help_text=_(
            "Credits every member gets on the 1st of the month, times their category's multiplier."
        ),
    )
    carry_over = models.CharField(
        _("carry-over of unused credit"),
        max_length=8,
        choices=CarryOver.choices,
        default=CarryOver.CAPPED,
    )
    carry_over_cap = models.DecimalField(
        _("carry-over cap"),
        max_digits=12,
        decimal_places=3,
        default=Decimal("500.000"),
        validators=[MinValueValidator(Decimal("0"))],
        help_text=_(
            "With capped carry-over, the most unused credit a member keeps into the next month."
        ),
    )
    efficiency_threshold_pct = models.FloatField(
        _("efficiency threshold (%)"),
        default=70.0,
        validators=[MinValueValidator(0.0), MaxValueValidator(100.0)],
        help_text=_("A finished job whose mean GPU utilisation is at least this earns a reward."),
    )
    efficiency_reward_share = models.DecimalField(
        _("efficiency reward share"),
        max_digits=4,
        decimal_places=3,
        default=Decimal("0.100"),
        validators=[MinValueValidator(Decimal("0")), MaxValueValidator(Decimal("1"))],
        help_text=_("The share of the job's charge given back as the reward, between 0 and 1."),
    )
    idle_threshold_pct = models.FloatField(
        _("idle threshold (%)"),
        default=5.0,
        validators=[MinValueValidator(0.0), MaxValueValidator(100.0)],
        help_text=_("A finished job whose mean GPU utilisation is below this is flagged as idle."),
    )
    low_credit_threshold = models.DecimalField(
        _("low-credit warning threshold"),
        max_digits=12,
        decimal_places=3,
        default=Decimal("100.000"),
        validators=[MinValueValidator(Decimal("0"))],
        help_text=_("Members are warned when their balance falls to this."),
    )
    charge_interval_minutes = models.PositiveSmallIntegerField(
        _("charging interval (minutes)"),
        default=5,
        validators=[MinValueValidator(1)],
        help_text=_("Running jobs are charged in windows of this length."),
    )
    preemptible_rate_pct = models.PositiveSmallIntegerField(
        _("preemptible jobs' rate (per cent of the queue's)"),
        default=50,
        validators=[MaxValueValidator(100)],
        help_text=_(
            "A job its member marks preemptible may be stopped (SIGTERM, the grace, then "
            "requeued) to make room; it pays this share of its queue's rate."
        ),
    )
    reservation_rate = models.DecimalField(
        _("reservation rate (credits per GPU-hour)"),
        max_digits=8,
        decimal_places=3,
        default=Decimal("1.000"),
        validators=[MinValueValidator(Decimal("0"))],
    )
    no_show_window_minutes = models.PositiveSmallIntegerField(
        _("no-show window (minutes)"),
        default=30,
        help_text=_(
            "A booking with no job started within this many minutes of its start is a no-show."
        ),
    )
    emergency_max_uses = models.PositiveSmallIntegerField(
        _("emergency uses per period"),
        default=2,
        help_text=_("How many approved emergency requests each member may have per period."),
    )
    emergency_period_days = models.PositiveSmallIntegerField(
        _("emergency period (days)"), default=90, validators=[MinValueValidator(1)]
    )
    emergency_default_hours = models.PositiveSmallIntegerField(
        _("emergency default length (hours)"), default=24, validators=[MinValueValidator(1)]
    )
    emergency_max_hours = models.PositiveSmallIntegerField(
        _("emergency longest length (hours)"), default=72, validators=[MinValueValidator(1)]
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = _("credit policy")
        verbose_name_plural = _("credit policy")
        constraints = [
            models.CheckConstraint(condition=models.Q(id=1), name="credit_policy_singleton"),
            models.CheckConstraint(
                condition=models.Q(efficiency_reward_share__gte=0)
                & models.Q(efficiency_reward_share__lte=1),
                name="credit_policy_reward_share_0_1",
                violation_error_message=_(
                    "The efficiency reward share is a share from 0 to 1 (e.g. 0.1 returns "
                    "10%% of a job's cost)."
                ),
            ),
        ]

    def __str__(self) -> str:
        return str(_("Credit policy"))

    def save(self, *args: object, **kwargs: object) -> None:
        self.pk = 1
        super().save(*args, **kwargs)  # type: ignore[arg-type]

    @property
    def efficiency_reward_pct(self) -> Decimal:
        """The reward share as a percentage (0.100 -> 10), the way members read it."""
        return Decimal(self.efficiency_reward_share) * 100

    @classmethod
    def current(cls) -> CreditPolicy:
        policy, _created = cls.objects.get_or_create(pk=1)
        return policy

    def grant_for(self, user: User) -> Decimal:
        """The monthly grant of `user`: the base grant times their category's multiplier."""
        multiplier = user.category.credit_multiplier if user.category is not None else Decimal("1")
        return (self.base_grant * multiplier).quantize(CREDIT_QUANTUM)

    def carried_over(self, balance: Decimal) -> Decimal:
        """What of `balance` survives into a new month. Debt always carries over."""
        if balance <= 0 or self.carry_over == self.CarryOver.FULL:
            return balance
        if self.carry_over == self.CarryOver.CAPPED:
            return min(balance, self.carry_over_cap)
        return Decimal("0")


# The ledger keeps credits to three decimals; charges and refunds are rounded alike.
CREDIT_QUANTUM = Decimal("0.001")


class CreditAccountQuerySet(models.QuerySet["CreditAccount"]):
    def with_ledger_sum(self) -> CreditAccountQuerySet:
        return self.annotate(
            ledger_sum=db_functions.Coalesce(
                models.Sum("entries__amount"),
                models.Value(Decimal("0")),
                output_field=models.DecimalField(max_digits=14, decimal_places=3),
            )
        )

    def inconsistent(self) -> CreditAccountQuerySet:
        """Accounts whose cached balance differs from the sum of their entries (should be none)."""
        return self.with_ledger_sum().exclude(balance=models.F("ledger_sum"))


class CreditAccount(models.Model):
    """A member's credits. `balance` caches the sum of the entries, updated in the same transaction."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="credit_account"
    )
    balance = models.DecimalField(
        _("balance"), max_digits=14, decimal_places=3, default=Decimal("0")
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = CreditAccountQuerySet.as_manager()

    class Meta:
        verbose_name = _("credit account")
        verbose_name_plural = _("credit accounts")
        ordering = ["user__username"]

    def __str__(self) -> str:
        return f"{self.user}: {self.balance}"

    @property
    def has_credit(self) -> bool:
        return self.balance > 0


class LedgerEntry(models.Model):
    """One movement of credits. Append-only: entries are never changed or deleted."""

    class Kind(models.TextChoices):
        GRANT = "grant", _("monthly grant")
        CHARGE = "charge", _("job charge")
        REFUND = "refund", _("refund")
        REWARD = "reward", _("efficiency reward")
        RESERVATION = "reservation", _("reservation")
        NO_SHOW = "no_show", _("no-show")
        EXPIRY = "expiry", _("expired credit")
        ADJUSTMENT = "adjustment", _("adjustment")

    account = models.ForeignKey(CreditAccount, on_delete=models.PROTECT, related_name="entries")
    kind = models.CharField(_("kind"), max_length=16, choices=Kind.choices, db_index=True)
    amount = models.DecimalField(_("amount"), max_digits=14, decimal_places=3)
    balance_after = models.DecimalField(_("balance after"), max_digits=14, decimal_places=3)
    idempotency_key = models.CharField(_("idempotency key"), max_length=200, unique=True)
    job = models.ForeignKey(
        "jobqueue.Job",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="ledger_entries",
    )
    reservation = models.ForeignKey(
        "reservations.Reservation",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="ledger_entries",
    )
    note = models.CharField(_("note"), max_length=300, blank=True)
    # The note's msgid and parameters, so that pages show it in the reader's language;
    # `note` keeps the English text for the API and the admin.
    note_i18n = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(_("when"), default=timezone.now, db_index=True)

    class Meta:
        verbose_name = _("ledger entry")
        verbose_name_plural = _("ledger entries")
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["account", "created_at"]),
            models.Index(fields=["job", "kind"]),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.amount:+}"

    def save(self, *args: object, **kwargs: object) -> None:
        if self.pk is not None and not self._state.adding:
            raise ValueError("Ledger entries are append-only; post a new entry instead.")
        super().save(*args, **kwargs)  # type: ignore[arg-type]

    def delete(self, *args: object, **kwargs: object) -> tuple[int, dict[str, int]]:
        raise ValueError("Ledger entries are append-only; post a new entry instead.")

    @property
    def note_text(self) -> str:
        """The note in the reader's language, when it was stored as a msgid and parameters."""
        msgid = self.note_i18n.get("msgid") if isinstance(self.note_i18n, dict) else None
        if not isinstance(msgid, str):
            return self.note
        params = {k: rendered(v) for k, v in (self.note_i18n.get("params") or {}).items()}
        try:
            return gettext(msgid) % params if params else gettext(msgid)
        except (KeyError, TypeError, ValueError):
            return self.note


class JobEfficiency(models.Model):
    """What the efficiency check found for one finished job; written once, when the job is settled."""

    class Verdict(models.TextChoices):
        REWARDED = "rewarded", _("rewarded")
        ORDINARY = "ordinary", _("below the reward threshold")
        IDLE = "idle", _("idle on its GPUs")
        UNKNOWN = "unknown", _("no utilisation samples")

    job = models.OneToOneField("jobqueue.Job", on_delete=models.CASCADE, related_name="efficiency")
    mean_util_pct = models.FloatField(_("mean GPU utilisation (%)"), null=True, blank=True)
    sample_count = models.PositiveIntegerField(_("samples"), default=0)
    verdict = models.CharField(_("verdict"), max_length=16, choices=Verdict.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = _("job efficiency")
        verbose_name_plural = _("job efficiencies")

    def __str__(self) -> str:
        return f"{self.job_id}: {self.verdict}"


# --- Notifications ------------------------------------------------------------


class NotificationQuerySet(models.QuerySet["Notification"]):
    def unread(self) -> NotificationQuerySet:
        return self.filter(read_at__isnull=True)

    def for_user(self, user: User) -> NotificationQuerySet:
        return self.filter(user=user)


class Notification(models.Model):
    """Something a member should know: shown under the bell and, usually, sent by email."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications"
    )
    kind = models.CharField(_("kind"), max_length=40, db_index=True)
    title = models.CharField(_("title"), max_length=200)
    body = models.TextField(_("message"), blank=True)
    # What to say (core.i18n.stored_form), rendered in the reader's language when read; the
    # words above are the creation language's, for rows without it and for search.
    title_message = models.JSONField(null=True, blank=True, editable=False)
    body_message = models.JSONField(null=True, blank=True, editable=False)
    url = models.CharField(_("link"), max_length=500, blank=True)
    # Lets a caller that may run twice (a beat task, a re-delivered event) notify once.
    dedupe_key = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(_("when"), default=timezone.now, db_index=True)
    read_at = models.DateTimeField(_("read"), null=True, blank=True)
    emailed_at = models.DateTimeField(_("emailed"), null=True, blank=True)

    objects = NotificationQuerySet.as_manager()

    class Meta:
        verbose_name = _("notification")
        verbose_name_plural = _("notifications")
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["user", "read_at"])]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "dedupe_key"],
                condition=~models.Q(dedupe_key=""),
                name="notification_dedupe_once_per_user",
            ),
        ]

    def __str__(self) -> str:
        return self.title

    @property
    def local_title(self) -> str:
        """The title in the active language; a row stored as words reads as written."""
        return str(rendered(self.title_message)) if self.title_message is not None else self.title

    @property
    def local_body(self) -> str:
        """The message in the active language; a row stored as words reads as written."""
        return str(rendered(self.body_message)) if self.body_message is not None else self.body

    @property
    def is_read(self) -> bool:
        return self.read_at is not None

    def mark_read(self) -> None:
        if self.read_at is None:
            self.read_at = timezone.now()
            self.save(update_fields=["read_at"])

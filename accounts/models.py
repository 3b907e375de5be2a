"""People: users, their categories and their personal access tokens."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


class Category(models.Model):
    """A kind of member ("PhD, thesis phase", "Master", ...) with its own rules."""

    name = models.CharField(_("name"), max_length=80, unique=True)
    description = models.TextField(_("description"), blank=True)
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
    debug_allowance_gpu_hours = models.PositiveIntegerField(
        _("debug allowance (GPU-hours per week)"), default=10
    )

    class Meta:
        verbose_name = _("category")
        verbose_name_plural = _("categories")
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(priority_factor__gte=0) & models.Q(priority_factor__lte=1),
                name="category_priority_factor_0_1",
            ),
        ]

    def __str__(self) -> str:
        return self.name


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

    class Meta(AbstractUser.Meta):
        swappable = "AUTH_USER_MODEL"

    @property
    def display_name(self) -> str:
        return self.get_full_name() or self.username

    def can_log_in(self) -> bool:
        return self.is_active and self.approval == self.Approval.APPROVED

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


class PersonalAccessToken(models.Model):
    """A token for the API and labctl. Only its SHA-256 is stored; the secret is shown once."""

    PREFIX = "lp_"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="access_tokens"
    )
    name = models.CharField(_("name"), max_length=80)
    token_prefix = models.CharField(max_length=12, editable=False)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(_("expires"), null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = PersonalAccessTokenQuerySet.as_manager()

    class Meta:
        verbose_name = _("personal access token")
        verbose_name_plural = _("personal access tokens")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.token_prefix}…)"

    @staticmethod
    def hash_secret(secret: str) -> str:
        return hashlib.sha256(secret.encode()).hexdigest()

    @classmethod
    def issue(
        cls, *, user: User, name: str, lifetime: timedelta | None = None
    ) -> tuple[PersonalAccessToken, str]:
        """Create a token; returns it and the secret, which is never stored."""
        secret = cls.PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(
            user=user,
            name=name,
            token_prefix=secret[:10],
            token_hash=cls.hash_secret(secret),
            expires_at=timezone.now() + lifetime if lifetime else None,
        )
        return token, secret

    @classmethod
    def authenticate(cls, secret: str) -> PersonalAccessToken | None:
        token = (
            cls.objects.usable()
            .select_related("user")
            .filter(token_hash=cls.hash_secret(secret))
            .first()
        )
        if token is None or not token.user.can_log_in():
            return None
        return token

    @property
    def is_usable(self) -> bool:
        return self.revoked_at is None and (
            self.expires_at is None or self.expires_at > timezone.now()
        )

    def revoke(self) -> None:
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at"])

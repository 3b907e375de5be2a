"""Slurm mode, the lab's rules: what the portal charged from accounting, the values it manages
in Slurm (and the conflicts with hand edits), and the reservations it made for bookings.

Imported by ``slurm/models.py`` so that Django registers them in the ``slurm`` app.
"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


class SlurmCharge(models.Model):
    """What one Slurm job (id + submit time: ids restart when slurmctld's state is reset) was charged.

    The ledger's idempotency keys already make every posting happen once; this row lets a
    reconciliation pass skip settled jobs without a query each, and shows the admin how a
    job's credits were found.
    """

    slurm_job_id = models.PositiveBigIntegerField(_("Slurm job id"))
    submitted_at = models.DateTimeField(_("submitted"))
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="slurm_charges"
    )
    job = models.ForeignKey(
        "jobqueue.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    queue = models.ForeignKey(
        "jobqueue.Queue", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # A plain-sbatch job's --wckey naming a portal project its member may charge: the usage
    # report's project table counts it (a portal job's project is the job's own).
    project = models.ForeignKey(
        "accounts.Project",
        verbose_name=_("project"),
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    gpus = models.PositiveSmallIntegerField(_("GPUs"), default=0)
    started_at = models.DateTimeField(_("started"))
    charged_seconds = models.PositiveBigIntegerField(_("seconds charged"), default=0)
    charged = models.DecimalField(
        _("credits charged"), max_digits=14, decimal_places=3, default=Decimal("0")
    )
    final = models.BooleanField(_("settled"), default=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = _("Slurm job charge")
        verbose_name_plural = _("Slurm job charges")
        ordering = ["-slurm_job_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["slurm_job_id", "submitted_at"], name="slurm_charge_once_per_job"
            )
        ]

    def __str__(self) -> str:
        return f"slurm:{self.slurm_job_id} {self.charged}"


class ManagedValue(models.Model):
    """A value the portal set in Slurm, as last agreed by both sides (the base of a three-way merge).

    ``key`` names the thing (``share:lp-phd``, ``grant-qos:alice:high``, ...). The portal
    manages only what has a row here; everything else in Slurm belongs to its admin.
    """

    key = models.CharField(max_length=200, unique=True)
    value = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = _("managed Slurm value")
        verbose_name_plural = _("managed Slurm values")
        ordering = ["key"]

    def __str__(self) -> str:
        return f"{self.key}={self.value}"


class PolicyConflictQuerySet(models.QuerySet["PolicyConflict"]):
    def open(self) -> PolicyConflictQuerySet:
        return self.filter(resolved_at__isnull=True)


class PolicyConflict(models.Model):
    """A managed value that both the portal and Slurm's admin changed: left alone until an admin decides."""

    key = models.CharField(max_length=200)
    base_value = models.CharField(_("last agreed value"), max_length=200, blank=True)
    portal_value = models.CharField(_("portal's value"), max_length=200, blank=True)
    slurm_value = models.CharField(_("Slurm's value"), max_length=200, blank=True)
    detected_at = models.DateTimeField(_("detected"), default=timezone.now)
    resolved_at = models.DateTimeField(_("resolved"), null=True, blank=True)
    resolution = models.CharField(_("resolution"), max_length=16, blank=True)

    objects = PolicyConflictQuerySet.as_manager()

    class Meta:
        verbose_name = _("Slurm policy conflict")
        verbose_name_plural = _("Slurm policy conflicts")
        ordering = ["-detected_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["key"],
                condition=models.Q(resolved_at__isnull=True),
                name="slurm_policy_conflict_one_open_per_key",
            )
        ]

    def __str__(self) -> str:
        return f"{self.key}: portal {self.portal_value} / Slurm {self.slurm_value}"


class SlurmReservation(models.Model):
    """The Slurm reservation made for one calendar booking."""

    class Granularity(models.TextChoices):
        NODE = "node", _("whole node")
        CORES = "cores", _("cores on the node (GPUs not fenced)")

    reservation = models.OneToOneField(
        "reservations.Reservation", on_delete=models.CASCADE, related_name="slurm_reservation"
    )
    name = models.CharField(_("Slurm reservation"), max_length=64, unique=True)
    spec = models.CharField(_("what Slurm was told"), max_length=500, blank=True)
    granularity = models.CharField(
        _("granularity"), max_length=8, choices=Granularity.choices, default=Granularity.NODE
    )
    error = models.CharField(_("last error"), max_length=500, blank=True)
    synced_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("Slurm reservation")
        verbose_name_plural = _("Slurm reservations")

    def __str__(self) -> str:
        return self.name


class SetupProblemQuerySet(models.QuerySet["SetupProblem"]):
    def open(self) -> SetupProblemQuerySet:
        return self.filter(resolved_at__isnull=True)


class SetupProblem(models.Model):
    """Something the portal could not do in Slurm (a refused ``sacctmgr`` change), what Slurm
    said, and the command that fixes it: the admin's setup check. Closed when a later pass
    does it, or no longer needs to."""

    key = models.CharField(_("what the portal tried"), max_length=300)
    message = models.CharField(_("what Slurm answered"), max_length=500, blank=True)
    fix = models.TextField(_("how to fix it"), blank=True)
    first_seen = models.DateTimeField(_("first seen"), default=timezone.now)
    last_seen = models.DateTimeField(_("last seen"), default=timezone.now)
    times = models.PositiveIntegerField(_("times"), default=1)
    resolved_at = models.DateTimeField(_("resolved"), null=True, blank=True)

    objects = SetupProblemQuerySet.as_manager()

    class Meta:
        verbose_name = _("Slurm setup problem")
        verbose_name_plural = _("Slurm setup check")
        ordering = ["resolved_at", "-last_seen"]
        constraints = [
            models.UniqueConstraint(
                fields=["key"],
                condition=models.Q(resolved_at__isnull=True),
                name="slurm_setup_problem_one_open_per_key",
            )
        ]

    def __str__(self) -> str:
        return self.key

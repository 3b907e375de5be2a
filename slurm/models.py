"""Slurm mode: how the portal's queues, members and jobs map onto a Slurm cluster.

Used only when ``LABPORTAL_EXECUTOR=slurm``; in agents mode these tables stay empty.
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

# POSIX portable user names, as useradd accepts them: the name sbatch runs under.
unix_name_validator = RegexValidator(
    r"^[a-z_][a-z0-9_.-]{0,31}$",
    _("A unix user name: lower-case letters, digits, '_', '.', '-', at most 32 characters."),
)


class QueueMapping(models.Model):
    """Where a portal queue's jobs go in Slurm: a partition, a QOS, or both.

    An empty partition means the cluster's default partition; an empty QOS means the
    association's default QOS. The admin changes these in the admin site.
    """

    queue = models.OneToOneField(
        "jobqueue.Queue", on_delete=models.CASCADE, related_name="slurm_mapping"
    )
    partition = models.CharField(_("Slurm partition"), max_length=64, blank=True)
    qos = models.CharField(_("Slurm QOS"), max_length=64, blank=True)

    class Meta:
        verbose_name = _("queue mapping")
        verbose_name_plural = _("queue mappings")

    def __str__(self) -> str:
        return f"{self.queue.name} → {self.partition or '(default)'}/{self.qos or '(default)'}"

    def sbatch_options(self) -> dict[str, str]:
        """The ``--partition``/``--qos`` options this mapping sets, without empty ones."""
        options = {"partition": self.partition, "qos": self.qos}
        return {k: v for k, v in options.items() if v}


class UnixLogin(models.Model):
    """The unix user a member's Slurm jobs run as; set by staff, never guessed."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="unix_login"
    )
    username = models.CharField(
        _("unix user name"), max_length=32, unique=True, validators=[unix_name_validator]
    )

    class Meta:
        verbose_name = _("unix login")
        verbose_name_plural = _("unix logins")

    def __str__(self) -> str:
        return f"{self.user} → {self.username}"


class Partition(models.Model):
    """A Slurm partition as the last inventory sync saw it."""

    name = models.CharField(_("name"), max_length=64, unique=True)
    state = models.CharField(_("state"), max_length=16, blank=True)
    is_default = models.BooleanField(_("default partition"), default=False)
    max_time_s = models.PositiveIntegerField(_("max time (seconds)"), null=True, blank=True)
    nodes = models.ManyToManyField("cluster.Node", blank=True, related_name="slurm_partitions")
    synced_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        verbose_name = _("Slurm partition")
        verbose_name_plural = _("Slurm partitions")

    def __str__(self) -> str:
        return self.name


class SlurmJobQuerySet(models.QuerySet["SlurmJob"]):
    def unfinished(self) -> SlurmJobQuerySet:
        return self.filter(ended_at__isnull=True)


class SlurmJob(models.Model):
    """One Slurm job as Slurm last reported it; ``job`` is set when the portal submitted it."""

    slurm_job_id = models.PositiveBigIntegerField(_("Slurm job id"), unique=True)
    job = models.OneToOneField(
        "jobqueue.Job",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="slurm",
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="slurm_jobs",
    )
    unix_user = models.CharField(_("unix user"), max_length=32, blank=True)
    name = models.CharField(_("name"), max_length=200, blank=True)
    partition = models.CharField(_("partition"), max_length=64, blank=True)
    qos = models.CharField(_("QOS"), max_length=64, blank=True)
    account = models.CharField(_("account"), max_length=64, blank=True)
    state = models.CharField(_("Slurm state"), max_length=32, blank=True)
    reason = models.CharField(_("Slurm reason"), max_length=120, blank=True)
    nodes = models.CharField(_("nodes"), max_length=255, blank=True)
    gpus = models.PositiveSmallIntegerField(_("GPUs"), default=0)
    estimated_start = models.DateTimeField(_("estimated start"), null=True, blank=True)
    submitted_at = models.DateTimeField(_("submitted"), null=True, blank=True)
    started_at = models.DateTimeField(_("started"), null=True, blank=True)
    ended_at = models.DateTimeField(_("ended"), null=True, blank=True)
    exit_code = models.IntegerField(_("exit code"), null=True, blank=True)
    output_path = models.CharField(_("output file"), max_length=500, blank=True)
    synced_at = models.DateTimeField(default=timezone.now)

    objects = SlurmJobQuerySet.as_manager()

    class Meta:
        ordering = ["-slurm_job_id"]
        verbose_name = _("Slurm job")
        verbose_name_plural = _("Slurm jobs")

    def __str__(self) -> str:
        return f"slurm:{self.slurm_job_id}"


class SlurmArray(models.Model):
    """A portal job array submitted as one ``sbatch --array``: Slurm's ArrayJobId for the
    portal's array. A task gets its own SlurmJob row once Slurm reports it on its own (it
    started, or ended); until then it waits in the array's one pending record."""

    array_job_id = models.PositiveBigIntegerField(_("Slurm array job id"), unique=True)
    # The portal's array (Job.array_id: its first task's id).
    portal_array_id = models.PositiveBigIntegerField(_("portal array id"), unique=True)
    unix_user = models.CharField(_("unix user"), max_length=32)
    # The tasks' output file, with Slurm's %A (array job id) and %a (task index).
    output_pattern = models.CharField(_("output file"), max_length=500)
    submitted_at = models.DateTimeField(_("submitted"), default=timezone.now)

    class Meta:
        ordering = ["-array_job_id"]
        verbose_name = _("Slurm job array")
        verbose_name_plural = _("Slurm job arrays")

    def __str__(self) -> str:
        return f"slurm:{self.array_job_id}_[…] (array {self.portal_array_id})"

    def task_spec(self, index: int) -> str:
        """Slurm's id of one task (``scancel 41_3``, ``--dependency=afterok:41_3``)."""
        return f"{self.array_job_id}_{index}"

    def output_path(self, index: int) -> str:
        return self.output_pattern.replace("%A", str(self.array_job_id)).replace("%a", str(index))


# The lab's rules in Slurm mode (accounting, policy, reservations) keep their tables here.
from slurm.rules_models import (  # noqa: E402, F401
    ManagedValue,
    PolicyConflict,
    SlurmCharge,
    SlurmReservation,
)

"""Measurements: raw GPU samples as the agents report them, their rollups and retention,
and what the Prometheus exposition needs (scrape tokens, histograms kept in the database).

Each GPU's latest reading is also kept on `cluster.Gpu` so the live page reads one
row per GPU.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from core.models import HashedToken


class GpuSample(models.Model):
    """One NVML reading of one GPU (or MIG instance). Any metric may be missing."""

    gpu = models.ForeignKey(
        "cluster.Gpu", verbose_name=_("GPU"), on_delete=models.CASCADE, related_name="samples"
    )
    ts = models.DateTimeField(_("sampled at"))
    util_pct = models.FloatField(_("utilisation %"), null=True, blank=True)
    mem_used_mb = models.PositiveIntegerField(_("memory used (MiB)"), null=True, blank=True)
    mem_total_mb = models.PositiveIntegerField(_("memory total (MiB)"), null=True, blank=True)
    temp_c = models.FloatField(_("temperature °C"), null=True, blank=True)
    power_w = models.FloatField(_("power W"), null=True, blank=True)
    sm_clock_mhz = models.PositiveIntegerField(_("SM clock (MHz)"), null=True, blank=True)
    ecc_errors = models.PositiveBigIntegerField(_("ECC errors"), null=True, blank=True)
    xid_errors = models.PositiveBigIntegerField(_("XID errors"), null=True, blank=True)
    # [{"pid", "used_mb", "container_id", "job_id"}, ...] as the agent saw them.
    processes = models.JSONField(_("processes"), default=list, blank=True)
    # Not a foreign key: samples outlive jobs' rows in reports, and a shared GPU's
    # several jobs are all in `processes`; this is the one job when there is one.
    job_id = models.PositiveBigIntegerField(_("job"), null=True, blank=True)

    class Meta:
        verbose_name = _("GPU sample")
        verbose_name_plural = _("GPU samples")
        ordering = ["-ts"]
        constraints = [
            # The broker may deliver a batch twice: the second copy inserts nothing.
            models.UniqueConstraint(fields=["gpu", "ts"], name="gpu_sample_once_per_instant"),
        ]
        indexes = [
            models.Index(fields=["ts"], name="gpu_sample_ts"),
            models.Index(fields=["job_id", "ts"], name="gpu_sample_job_ts"),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_id} @ {self.ts:%Y-%m-%d %H:%M:%S}"


class GpuRollup(models.Model):
    """One GPU's measurements over one bucket (a minute or an hour), and who held it.

    Means and maxima ignore missing readings. `job` is the job that held the GPU for
    most of the bucket: the job the agent saw running on it, or else the job that had
    it allocated (so a GPU held by an idle job still names that job).
    """

    gpu = models.ForeignKey(
        "cluster.Gpu", verbose_name=_("GPU"), on_delete=models.CASCADE, related_name="+"
    )
    bucket = models.DateTimeField(_("period start"))
    samples = models.PositiveIntegerField(_("samples"))
    util_mean = models.FloatField(_("mean utilisation %"), null=True, blank=True)
    util_max = models.FloatField(_("peak utilisation %"), null=True, blank=True)
    mem_used_max_mb = models.PositiveIntegerField(
        _("peak memory used (MiB)"), null=True, blank=True
    )
    temp_max_c = models.FloatField(_("peak temperature °C"), null=True, blank=True)
    power_mean_w = models.FloatField(_("mean power W"), null=True, blank=True)
    job = models.ForeignKey(
        "jobqueue.Job",
        verbose_name=_("job"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("user"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )

    class Meta:
        abstract = True
        ordering = ["-bucket"]

    def __str__(self) -> str:
        return f"{self.gpu_id} @ {self.bucket:%Y-%m-%d %H:%M}"


class GpuMinuteRollup(GpuRollup):
    """A GPU's minute: kept for the minute retention (30 days by default)."""

    class Meta(GpuRollup.Meta):
        verbose_name = _("GPU minute")
        verbose_name_plural = _("GPU minutes")
        constraints = [
            models.UniqueConstraint(fields=["gpu", "bucket"], name="gpu_minute_once"),
        ]
        indexes = [
            models.Index(fields=["bucket"], name="gpu_minute_bucket"),
            models.Index(fields=["job", "bucket"], name="gpu_minute_job"),
            models.Index(fields=["user", "bucket"], name="gpu_minute_user"),
        ]


class GpuHourRollup(GpuRollup):
    """A GPU's hour, rolled up from its minutes: kept for good by default.

    `minutes` counts the minutes with readings, `busy_minutes` those in which any job
    held the GPU, `held_minutes` those in which `job` held it; GPU-hours of a job or a
    user are `held_minutes / 60`.
    """

    minutes = models.PositiveSmallIntegerField(_("minutes with readings"))
    busy_minutes = models.PositiveSmallIntegerField(_("minutes held by a job"))
    held_minutes = models.PositiveSmallIntegerField(_("minutes held by this job"))

    class Meta(GpuRollup.Meta):
        verbose_name = _("GPU hour")
        verbose_name_plural = _("GPU hours")
        constraints = [
            models.UniqueConstraint(fields=["gpu", "bucket"], name="gpu_hour_once"),
        ]
        indexes = [
            models.Index(fields=["bucket"], name="gpu_hour_bucket"),
            models.Index(fields=["job", "bucket"], name="gpu_hour_job"),
            models.Index(fields=["user", "bucket"], name="gpu_hour_user"),
        ]


class RollupCursor(models.Model):
    """How far each rollup level is complete: buckets before `done_until` are rolled up.

    Ingest moves a cursor back when a late batch arrives, so the next run redoes
    those buckets; a run only moves a cursor forward from the value it started with.
    """

    class Level(models.TextChoices):
        MINUTE = "minute", _("minute")
        HOUR = "hour", _("hour")

    level = models.CharField(_("level"), max_length=8, choices=Level.choices, unique=True)
    done_until = models.DateTimeField(_("rolled up until"), null=True, blank=True)
    last_run_at = models.DateTimeField(_("last run"), null=True, blank=True)

    class Meta:
        verbose_name = _("rollup cursor")
        verbose_name_plural = _("rollup cursors")

    def __str__(self) -> str:
        return f"{self.level}: {self.done_until}"


class RetentionPolicy(models.Model):
    """How long telemetry is kept (one row, set by an admin)."""

    raw_days = models.PositiveIntegerField(
        _("raw samples kept (days)"),
        default=2,
        validators=[MinValueValidator(1)],
        help_text=_("Every reading as the agents sent it; a few days is enough for rollups."),
    )
    minute_days = models.PositiveIntegerField(
        _("minute rollups kept (days)"),
        default=30,
        validators=[MinValueValidator(1)],
        help_text=_("Per-minute history behind the 24-hour and job charts."),
    )
    hour_days = models.PositiveIntegerField(
        _("hourly rollups kept (days)"),
        null=True,
        blank=True,
        default=None,
        validators=[MinValueValidator(1)],
        help_text=_("Empty keeps hourly history for good (a year of 100 GPUs is under 1 GB)."),
    )

    class Meta:
        verbose_name = _("telemetry retention")
        verbose_name_plural = _("telemetry retention")

    def __str__(self) -> str:
        return str(_("Telemetry retention"))

    @classmethod
    def current(cls) -> RetentionPolicy:
        policy, _created = cls.objects.get_or_create(pk=1)
        return policy


class ScrapeToken(HashedToken):
    """A Bearer token Prometheus presents to read /metrics. Only its SHA-256 is stored."""

    PREFIX = "lpm_"

    name = models.CharField(_("name"), max_length=80, help_text=_("Which Prometheus uses it."))
    # The base's fields, with the names the admin shows.
    token_prefix = models.CharField(_("starts with"), max_length=12, editable=False)
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    last_used_at = models.DateTimeField(_("last used"), null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(_("revoked"), null=True, blank=True)

    class Meta:
        verbose_name = _("metrics scrape token")
        verbose_name_plural = _("metrics scrape tokens")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.token_prefix}…)"

    @classmethod
    def issue(cls, *, name: str) -> tuple[ScrapeToken, str]:
        secret, stored = cls.new_secret()
        token = cls.objects.create(name=name, **stored)
        return token, secret

    @classmethod
    def authenticate(cls, secret: str) -> ScrapeToken | None:
        """The active token with this secret, its use recorded at most once a minute."""
        token = cls.objects.filter(
            token_hash=cls.hash_secret(secret), revoked_at__isnull=True
        ).first()
        if token is not None:
            now = timezone.now()
            if token.last_used_at is None or now - token.last_used_at > timedelta(minutes=1):
                cls.objects.filter(pk=token.pk).update(last_used_at=now)
        return token


class ObservedHistogram(models.Model):
    """A Prometheus histogram kept in the database, so worker processes can observe
    and the web process can expose it (e.g. scheduling pass durations)."""

    name = models.CharField(max_length=64, unique=True)
    # Upper bounds in seconds, and the cumulative count at or below each.
    bounds = models.JSONField(default=list)
    counts = models.JSONField(default=list)
    total = models.FloatField(default=0.0)
    count = models.PositiveBigIntegerField(default=0)

    class Meta:
        verbose_name = _("observed histogram")
        verbose_name_plural = _("observed histograms")

    def __str__(self) -> str:
        return self.name

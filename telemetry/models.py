"""Measurements: raw GPU samples as the agents report them.

Rollups, pruning, alerts and the Prometheus exposition build on these rows later;
each GPU's latest reading is also kept on `cluster.Gpu` so the live page reads one
row per GPU.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


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

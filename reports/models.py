"""Long report work (what-if replays, PDF reports) run by the control worker, and the
audit log of scheduling-policy changes applied from a replay."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _


class ReportTask(models.Model):
    """A replay or a PDF asked for on the reports page; the control worker does the work."""

    class Kind(models.TextChoices):
        REPLAY = "replay", _("what-if replay")
        PDF = "pdf", _("PDF report")

    class State(models.TextChoices):
        QUEUED = "queued", _("queued")
        RUNNING = "running", _("running")
        DONE = "done", _("done")
        FAILED = "failed", _("failed")

    kind = models.CharField(_("kind"), max_length=8, choices=Kind.choices)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="report_tasks"
    )
    period_start = models.DateTimeField(_("period start"))
    period_end = models.DateTimeField(_("period end"))
    language = models.CharField(_("language"), max_length=16, default="en")
    # Replay: {"options": [{"label", "gpu_delta", "gpu_model", "policy_changes"}, ...]}
    params = models.JSONField(_("parameters"), default=dict, blank=True)
    state = models.CharField(
        _("state"), max_length=8, choices=State.choices, default=State.QUEUED, db_index=True
    )
    progress_done = models.PositiveIntegerField(default=0)
    progress_total = models.PositiveIntegerField(default=1)
    result = models.JSONField(_("result"), default=dict, blank=True)
    pdf = models.BinaryField(null=True, blank=True, editable=False)
    error = models.TextField(_("error"), blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("report task")
        verbose_name_plural = _("report tasks")
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} #{self.pk} ({self.get_state_display()})"

    @property
    def progress_pct(self) -> int:
        if self.state == self.State.DONE:
            return 100
        return int(100 * self.progress_done / max(1, self.progress_total))

    @property
    def is_finished(self) -> bool:
        return self.state in (self.State.DONE, self.State.FAILED)


class PolicyChange(models.Model):
    """The audit log of scheduling-policy changes applied from a what-if replay."""

    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    changed_at = models.DateTimeField(_("changed at"), auto_now_add=True)
    replay = models.ForeignKey(
        ReportTask, null=True, on_delete=models.SET_NULL, related_name="policy_changes"
    )
    before = models.JSONField(_("before"))
    after = models.JSONField(_("after"))
    predicted = models.JSONField(_("predicted effect"), default=dict, blank=True)

    class Meta:
        verbose_name = _("scheduling policy change")
        verbose_name_plural = _("scheduling policy changes")
        ordering = ["-changed_at", "-id"]

    def __str__(self) -> str:
        return f"{self.changed_at:%Y-%m-%d %H:%M} {self.after}"


class DemandForecast(models.Model):
    """The last demand forecast fitted by the control worker (never in a web request) and
    the data version it was fitted on; the page shows the newest row. `forecast` is None
    when the history was too short for one."""

    version = models.CharField(_("data version"), max_length=64)
    fitted_at = models.DateTimeField(_("fitted at"))
    forecast = models.JSONField(_("forecast"), null=True, blank=True)

    class Meta:
        verbose_name = _("demand forecast")
        verbose_name_plural = _("demand forecasts")
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.fitted_at:%Y-%m-%d %H:%M} ({self.version})"

"""Long report work (what-if replays, PDF reports) run by the control worker, the
audit log of scheduling-policy changes applied from a replay, and the lab's profile."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from core.i18n import in_reader_language


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


class LabProfile(models.Model):
    """Who the lab is, for the usage report a funding panel reads: its name and the day its
    sharing rules came in (the report compares the figures before and after it). One row."""

    name = models.CharField(
        _("lab name"), max_length=200, blank=True, help_text=_("As the usage report names it.")
    )
    name_zh_hans = models.CharField(_("lab name (Chinese)"), max_length=200, blank=True)
    institution = models.CharField(_("institution"), max_length=200, blank=True)
    institution_zh_hans = models.CharField(_("institution (Chinese)"), max_length=200, blank=True)
    rules_since = models.DateField(
        _("rules in force since"),
        null=True,
        blank=True,
        help_text=_(
            "The day the lab began sharing its GPUs through LabPortal's rules. The usage "
            "report compares allocation, utilisation and waits before it with after it."
        ),
    )

    class Meta:
        verbose_name = _("lab profile")
        verbose_name_plural = _("lab profile")

    def __str__(self) -> str:
        return self.display_name or str(_("lab profile"))

    @classmethod
    def current(cls) -> LabProfile:
        """The lab's one profile (an empty one until an admin fills it in)."""
        return cls.objects.order_by("pk").first() or cls()

    @property
    def display_name(self) -> str:
        return in_reader_language(self.name, self.name_zh_hans)

    @property
    def display_institution(self) -> str:
        return in_reader_language(self.institution, self.institution_zh_hans)

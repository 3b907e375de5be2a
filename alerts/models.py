"""Alerts: what the rules found (with a lifecycle kept for audit), and the admin's rule settings.

An alert's text is stored as a code (its kind) plus parameters and rendered in the
reader's language when shown (see `alerts.texts`), so a staff member reading in
Chinese and the member reading in English see the same alert in their own words.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


class Kind(models.TextChoices):
    IDLE_JOB = "idle_job", _("idle GPU")
    MEMORY_HIGH = "memory_high", _("GPU memory near the limit")
    MEMORY_LEAK = "memory_leak", _("memory leak")
    STRAY_PROCESS = "stray_process", _("stray process")
    GPU_HOT = "gpu_hot", _("GPU too hot")
    GPU_ERRORS = "gpu_errors", _("GPU errors (ECC/XID)")
    NODE_SILENT = "node_silent", _("node silent")
    IDLE_SESSION = "idle_session", _("idle session")


class AlertQuerySet(models.QuerySet["Alert"]):
    def open(self) -> AlertQuerySet:
        return self.exclude(state=Alert.State.RESOLVED)

    def about_job(self, job_id: int) -> AlertQuerySet:
        return self.filter(job_id=job_id)

    def about_user(self, user: Any) -> AlertQuerySet:
        """The alerts a member may read: about them, or about one of their jobs."""
        return self.filter(models.Q(user=user) | models.Q(job__owner=user))


class Alert(models.Model):
    """One condition a rule found on one subject. At most one open alert per (kind, subject)."""

    class State(models.TextChoices):
        FIRING = "firing", _("firing")
        ACKNOWLEDGED = "acknowledged", _("acknowledged")
        RESOLVED = "resolved", _("resolved")

    class Severity(models.TextChoices):
        WARNING = "warning", _("warning")
        CRITICAL = "critical", _("critical")

    kind = models.CharField(_("kind"), max_length=24, choices=Kind.choices)
    # "job:12", "gpu:7", "node:3", "gpu:7:pid:4242": what deduplication keys on.
    subject = models.CharField(_("subject"), max_length=120)
    state = models.CharField(
        _("state"), max_length=16, choices=State.choices, default=State.FIRING, db_index=True
    )
    severity = models.CharField(
        _("severity"), max_length=16, choices=Severity.choices, default=Severity.WARNING
    )
    params = models.JSONField(_("parameters"), default=dict, blank=True)
    job = models.ForeignKey(
        "jobqueue.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="alerts"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("user"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="alerts",
    )
    gpu = models.ForeignKey(
        "cluster.Gpu", null=True, blank=True, on_delete=models.SET_NULL, related_name="alerts"
    )
    node = models.ForeignKey(
        "cluster.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="alerts"
    )
    fired_at = models.DateTimeField(_("fired"), default=timezone.now, db_index=True)
    last_seen_at = models.DateTimeField(_("last seen"), default=timezone.now)
    # When the owner (or staff) was warned, and when the rule's action may follow.
    warned_at = models.DateTimeField(_("warned"), null=True, blank=True)
    action_due_at = models.DateTimeField(_("action due"), null=True, blank=True)
    action = models.CharField(_("action"), max_length=24, blank=True)
    action_taken_at = models.DateTimeField(_("action taken"), null=True, blank=True)
    acknowledged_at = models.DateTimeField(_("acknowledged"), null=True, blank=True)
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("acknowledged by"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    resolved_at = models.DateTimeField(_("resolved"), null=True, blank=True)

    objects = AlertQuerySet.as_manager()

    class Meta:
        verbose_name = _("alert")
        verbose_name_plural = _("alerts")
        ordering = ["-fired_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "subject"],
                condition=~models.Q(state="resolved"),
                name="alert_one_open_per_subject_and_kind",
            ),
        ]
        indexes = [models.Index(fields=["job", "state"], name="alert_job_state")]

    def __str__(self) -> str:
        return f"{self.kind} {self.subject} ({self.state})"

    @property
    def is_open(self) -> bool:
        return self.state != self.State.RESOLVED

    @property
    def message(self) -> str:
        """The alert's text in the active language."""
        from alerts.texts import alert_message

        return str(alert_message(self.kind, self.params))

    @property
    def advice(self) -> str:
        from alerts.texts import alert_advice

        return str(alert_advice(self.kind, self.params))

    def seconds_until_action(self, now: Any = None) -> int | None:
        if self.action_due_at is None or self.action_taken_at is not None:
            return None
        return max(0, int((self.action_due_at - (now or timezone.now())).total_seconds()))


class AlertEvent(models.Model):
    """The audit trail of an alert: fired, warned, acted, acknowledged, resolved."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(_("event"), max_length=24)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(_("when"), default=timezone.now)

    class Meta:
        verbose_name = _("alert event")
        verbose_name_plural = _("alert events")
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.alert_id} {self.kind}"


class AlertRule(models.Model):
    """The admin's settings for one kind of alert. Missing rows take the defaults below."""

    kind = models.CharField(_("kind"), max_length=24, choices=Kind.choices, unique=True)
    enabled = models.BooleanField(_("enabled"), default=True)
    threshold = models.FloatField(
        _("threshold"),
        help_text=_(
            "Idle: utilisation % below which a GPU counts as idle. Memory: % of the GPU memory. "
            "Leak: MiB held with no job process. Hot: °C. Errors: new ECC/XID errors. "
            "Node silent: not used (the heartbeat timeout applies). "
            "Idle session: not used (no request, key or message through the portal is what idle means)."
        ),
    )
    window_s = models.PositiveIntegerField(
        _("window (seconds)"), help_text=_("How long the condition must hold before it fires.")
    )
    grace_s = models.PositiveIntegerField(
        _("grace (seconds)"),
        default=0,
        help_text=_("Time between the warning and the action (idle jobs, leaks)."),
    )
    drain = models.BooleanField(
        _("drain"),
        default=False,
        help_text=_(
            "Hot GPUs and GPU errors: take the GPU out of service while the alert is open. (A leak that outlasts its grace always does.)"
        ),
    )
    email_staff = models.BooleanField(_("email staff"), default=True)

    DEFAULTS: dict[str, dict[str, Any]] = {
        Kind.IDLE_JOB: {"threshold": 5.0, "window_s": 30 * 60, "grace_s": 30 * 60},
        Kind.MEMORY_HIGH: {"threshold": 95.0, "window_s": 60, "grace_s": 0},
        Kind.MEMORY_LEAK: {"threshold": 256.0, "window_s": 120, "grace_s": 10 * 60},
        Kind.STRAY_PROCESS: {"threshold": 0.0, "window_s": 60, "grace_s": 0},
        Kind.GPU_HOT: {"threshold": 85.0, "window_s": 120, "grace_s": 0},
        Kind.GPU_ERRORS: {"threshold": 1.0, "window_s": 0, "grace_s": 0},
        Kind.NODE_SILENT: {"threshold": 0.0, "window_s": 0, "grace_s": 0},
        # As JupyterHub's idle culler: warned after an hour with nothing through the
        # proxy, stopped half an hour later unless something happens first.
        Kind.IDLE_SESSION: {"threshold": 0.0, "window_s": 60 * 60, "grace_s": 30 * 60},
    }

    class Meta:
        verbose_name = _("alert rule")
        verbose_name_plural = _("alert rules")
        ordering = ["kind"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(threshold__gte=0),
                name="alert_rule_threshold_non_negative",
                violation_error_message=_("The threshold cannot be negative."),
            ),
        ]

    def __str__(self) -> str:
        return str(self.get_kind_display())

    @classmethod
    def effective(cls) -> dict[str, AlertRule]:
        """Every kind's rule: the admin's row where there is one, else an unsaved default."""
        rows = {rule.kind: rule for rule in cls.objects.all()}
        return {
            kind: rows.get(kind) or cls(kind=kind, **defaults)
            for kind, defaults in cls.DEFAULTS.items()
        }


class QueueAlertPolicy(models.Model):
    """What the idle-job rule does in one queue after the owner was warned and the grace ran out."""

    class Action(models.TextChoices):
        WARN = "warn", _("warn only")
        NOTIFY_STAFF = "notify_staff", _("notify staff")
        STOP = "stop", _("stop the job")
        REQUEUE = "requeue", _("requeue the job")

    queue = models.OneToOneField(
        "jobqueue.Queue", on_delete=models.CASCADE, related_name="alert_policy"
    )
    idle_action = models.CharField(
        _("idle action"), max_length=16, choices=Action.choices, default=Action.WARN
    )
    idle_threshold_pct = models.FloatField(
        _("idle below (utilisation %)"),
        null=True,
        blank=True,
        help_text=_("Empty: the idle rule's threshold."),
    )
    idle_window_s = models.PositiveIntegerField(
        _("idle for (seconds)"),
        null=True,
        blank=True,
        help_text=_("Empty: the idle rule's window."),
    )
    idle_grace_s = models.PositiveIntegerField(
        _("grace after the warning (seconds)"),
        null=True,
        blank=True,
        help_text=_("Empty: the idle rule's grace."),
    )

    class Meta:
        verbose_name = _("queue alert policy")
        verbose_name_plural = _("queue alert policies")

    def __str__(self) -> str:
        return f"{self.queue} ({self.idle_action})"

from __future__ import annotations

from django.contrib import admin
from django.utils.translation import gettext_lazy

from alerts.models import Alert, AlertEvent, AlertRule, QueueAlertPolicy
from core.duration_fields import HumanDurationAdminMixin


@admin.register(AlertRule)
class AlertRuleAdmin(HumanDurationAdminMixin, admin.ModelAdmin[AlertRule]):
    duration_labels = {"window_s": gettext_lazy("window"), "grace_s": gettext_lazy("grace")}
    list_display = ("kind", "enabled", "threshold", "window_s", "grace_s", "drain", "email_staff")
    list_editable = ("enabled", "threshold", "window_s", "grace_s", "drain", "email_staff")


@admin.register(QueueAlertPolicy)
class QueueAlertPolicyAdmin(HumanDurationAdminMixin, admin.ModelAdmin[QueueAlertPolicy]):
    duration_labels = {
        "idle_window_s": gettext_lazy("idle for"),
        "idle_grace_s": gettext_lazy("grace after the warning"),
    }
    list_display = ("queue", "idle_action", "idle_threshold_pct", "idle_window_s", "idle_grace_s")


class AlertEventInline(admin.TabularInline[AlertEvent, Alert]):
    model = AlertEvent
    extra = 0
    can_delete = False
    readonly_fields = ("kind", "actor", "data", "created_at")


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin[Alert]):
    """Read-only: alerts are kept for audit; acknowledge them on the alerts page."""

    list_display = ("id", "kind", "subject", "state", "severity", "fired_at", "resolved_at")
    list_filter = ("state", "kind", "severity")
    search_fields = ("subject",)
    inlines = [AlertEventInline]

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: object, obj: object = None) -> bool:
        return False

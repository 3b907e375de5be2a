from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from telemetry.models import GpuSample, RetentionPolicy, RollupCursor


@admin.register(GpuSample)
class GpuSampleAdmin(admin.ModelAdmin[GpuSample]):
    """Raw samples, read-only: for looking into one GPU's recent past."""

    list_display = ("gpu", "ts", "util_pct", "mem_used_mb", "temp_c", "power_w", "job_id")
    list_filter = ("gpu__node",)
    search_fields = ("gpu__uuid", "gpu__node__name")
    date_hierarchy = "ts"
    list_select_related = ("gpu__node",)
    show_full_result_count = False  # the table is large; counting it would be slow

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(RetentionPolicy)
class RetentionPolicyAdmin(admin.ModelAdmin[RetentionPolicy]):
    """How long raw samples and rollups are kept; pruning follows within ten minutes."""

    list_display = ("__str__", "raw_days", "minute_days", "hour_days")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return not RetentionPolicy.objects.exists()

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(RollupCursor)
class RollupCursorAdmin(admin.ModelAdmin[RollupCursor]):
    """Where each rollup level has got to (read-only: for seeing that rollups keep up)."""

    list_display = ("level", "done_until", "last_run_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

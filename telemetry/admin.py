from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from telemetry.models import GpuSample, RetentionPolicy, RollupCursor, ScrapeToken


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


@admin.register(ScrapeToken)
class ScrapeTokenAdmin(admin.ModelAdmin[ScrapeToken]):
    """Tokens Prometheus presents on /metrics; the secret is shown once, when issued."""

    list_display = ("name", "token_prefix", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    fields = ("name", "revoked_at")
    actions = ("revoke",)

    def save_model(
        self, request: HttpRequest, obj: ScrapeToken, form: object, change: bool
    ) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        token, secret = ScrapeToken.issue(name=obj.name)
        obj.pk, obj.token_hash, obj.token_prefix, obj.created_at = (
            token.pk,
            token.token_hash,
            token.token_prefix,
            token.created_at,
        )
        self.message_user(
            request,
            _(
                "Scrape token %(secret)s — copy it now, it is not shown again. Put it in the "
                "file Prometheus reads as authorization.credentials_file "
                "(see deploy/monitoring/prometheus.yml)."
            )
            % {"secret": secret},
            messages.WARNING,
        )

    @admin.action(description=_("Revoke the selected scrape tokens"))
    def revoke(self, request: HttpRequest, queryset: QuerySet[ScrapeToken]) -> None:
        queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())

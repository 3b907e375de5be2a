"""Admin pages of the lab's rules in Slurm mode: charges, managed values, conflicts, reservations."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from slurm.policy import policy_conflict_resolve
from slurm.rules_models import (
    ManagedValue,
    PolicyConflict,
    SetupProblem,
    SlurmCharge,
    SlurmReservation,
)
from slurm.setup_check import record_host_problem_seen


@admin.register(SlurmCharge)
class SlurmChargeAdmin(admin.ModelAdmin[SlurmCharge]):
    list_display = ("slurm_job_id", "user", "job", "queue", "gpus", "charged", "final")
    list_filter = ("final", "queue")
    search_fields = ("slurm_job_id", "user__username")
    raw_id_fields = ("user", "job")
    readonly_fields = [f.name for f in SlurmCharge._meta.fields]


@admin.register(ManagedValue)
class ManagedValueAdmin(admin.ModelAdmin[ManagedValue]):
    list_display = ("key", "value", "updated_at")
    search_fields = ("key",)
    readonly_fields = ("key", "value", "updated_at")


def _resolve(request: HttpRequest, queryset: QuerySet[PolicyConflict], keep: str) -> None:
    done = 0
    for conflict in queryset.filter(resolved_at__isnull=True):
        policy_conflict_resolve(conflict_id=conflict.pk, keep=keep)
        done += 1
    messages.success(
        request,
        ngettext(
            "%(count)d conflict resolved; the next pass applies it.",
            "%(count)d conflicts resolved; the next pass applies them.",
            done,
        )
        % {"count": done},
    )


@admin.register(PolicyConflict)
class PolicyConflictAdmin(admin.ModelAdmin[PolicyConflict]):
    list_display = (
        "key",
        "base_value",
        "portal_value",
        "slurm_value",
        "detected_at",
        "resolved_at",
        "resolution",
    )
    list_filter = ("resolution",)
    readonly_fields = list_display
    actions = ("keep_portal", "keep_slurm")

    @admin.action(description=_("Keep the portal's value (write it to Slurm)"))
    def keep_portal(self, request: HttpRequest, queryset: QuerySet[PolicyConflict]) -> None:
        _resolve(request, queryset, "portal")

    @admin.action(description=_("Keep Slurm's value (take it into the portal)"))
    def keep_slurm(self, request: HttpRequest, queryset: QuerySet[PolicyConflict]) -> None:
        _resolve(request, queryset, "slurm")


@admin.register(SlurmReservation)
class SlurmReservationAdmin(admin.ModelAdmin[SlurmReservation]):
    list_display = ("name", "reservation", "granularity", "error", "synced_at")
    list_filter = ("granularity",)
    readonly_fields = ("reservation", "name", "spec", "granularity", "error", "synced_at")


class OpenFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("open", _("open")), ("resolved", _("resolved"))]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[SetupProblem]
    ) -> QuerySet[SetupProblem]:
        if self.value() == "open":
            return queryset.filter(resolved_at__isnull=True)
        if self.value() == "resolved":
            return queryset.filter(resolved_at__isnull=False)
        return queryset


@admin.register(SetupProblem)
class SetupProblemAdmin(admin.ModelAdmin[SetupProblem]):
    """The setup check: each change Slurm refused the portal, Slurm's words, and the fix."""

    list_display = (
        "key",
        "message",
        "fix_command",
        "first_seen",
        "last_seen",
        "times",
        "resolved_at",
    )
    list_filter = (OpenFilter,)
    search_fields = ("key", "message")
    readonly_fields = ("key", "message", "fix", "first_seen", "last_seen", "times", "resolved_at")

    @admin.display(description=_("how to fix it"))
    def fix_command(self, problem: SetupProblem) -> str:
        return format_html('<pre class="setup-fix">{}</pre>', problem.fix)

    def get_queryset(self, request: HttpRequest) -> QuerySet[SetupProblem]:
        record_host_problem_seen()  # a command the portal host could not run, noted since
        return super().get_queryset(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: SetupProblem | None = None) -> bool:
        return False

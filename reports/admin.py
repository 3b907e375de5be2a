from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest

from reports.models import DemandForecast, LabProfile, PolicyChange, ReportTask


@admin.register(ReportTask)
class ReportTaskAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "kind",
        "state",
        "requested_by",
        "period_start",
        "period_end",
        "created_at",
    ]
    list_filter = ["kind", "state"]
    readonly_fields = [f.name for f in ReportTask._meta.fields if f.name != "pdf"]
    exclude = ["pdf"]


@admin.register(PolicyChange)
class PolicyChangeAdmin(admin.ModelAdmin):
    """The audit log: read-only, nobody edits history."""

    list_display = ["changed_at", "changed_by", "after", "replay"]
    readonly_fields = ["changed_at", "changed_by", "replay", "before", "after", "predicted"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


@admin.register(DemandForecast)
class DemandForecastAdmin(admin.ModelAdmin):
    """When the control worker last fitted the demand forecast, and on which data. Read
    only; deleting the row makes the report page queue a new fit."""

    list_display = ["fitted_at", "version"]
    readonly_fields = ["fitted_at", "version", "forecast"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


@admin.register(LabProfile)
class LabProfileAdmin(admin.ModelAdmin):
    """The lab's one profile: its name and the day its rules came in, for the usage report."""

    list_display = ["__str__", "institution", "rules_since"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return not LabProfile.objects.exists()

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

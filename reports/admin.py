from django.contrib import admin

from reports.models import DemandForecast, PolicyChange, ReportTask


@admin.register(ReportTask)
class ReportTaskAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
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
class PolicyChangeAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """The audit log: read-only, nobody edits history."""

    list_display = ["changed_at", "changed_by", "after", "replay"]
    readonly_fields = ["changed_at", "changed_by", "replay", "before", "after", "predicted"]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(DemandForecast)
class DemandForecastAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """When the control worker last fitted the demand forecast, and on which data. Read
    only; deleting the row makes the report page queue a new fit."""

    list_display = ["fitted_at", "version"]
    readonly_fields = ["fitted_at", "version", "forecast"]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

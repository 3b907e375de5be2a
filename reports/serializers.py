"""API shapes of the reports (documented in the OpenAPI schema); the rows are the CSV rows."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from reports.lines import FINAL_STATES
from reports.models import ReportTask
from reports.periods import KINDS
from reports.services import MAX_GPU_MODEL_CHARS, MAX_LABEL_CHARS, MAX_OPTIONS


class PeriodSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField(help_text="The first moment after the period.")
    label = serializers.CharField()  # type: ignore[assignment]  # DRF's Field.label is a str


def _usage_line_fields() -> dict[str, serializers.Field]:
    fields: dict[str, serializers.Field] = {
        "name": serializers.CharField(),
        "gpu_hours": serializers.FloatField(help_text="GPU-hours allocated."),
        "used_gpu_hours": serializers.FloatField(
            help_text="Covered GPU-hours weighted by their measured utilisation."
        ),
        "coverage_pct": serializers.FloatField(
            allow_null=True,
            help_text="Telemetry coverage: the share of the allocated GPU-hours that had samples.",
        ),
        "mean_util_pct": serializers.FloatField(
            allow_null=True, help_text="Mean utilisation over the covered GPU-hours only."
        ),
        "credits": serializers.FloatField(help_text="Credits spent, net of refunds."),
    }
    for state in FINAL_STATES:
        fields[f"jobs_{state}"] = serializers.IntegerField()
    return fields


UsageLineSerializer = type("UsageLineSerializer", (serializers.Serializer,), _usage_line_fields())


class WaitLineSerializer(serializers.Serializer):
    queue = serializers.CharField()
    jobs_started = serializers.IntegerField()
    wait_mean_h = serializers.FloatField()
    wait_p50_h = serializers.FloatField()
    wait_p95_h = serializers.FloatField()


class WeekLineSerializer(serializers.Serializer):
    week = serializers.DateField(help_text="The Monday of the week.")
    capacity_gpu_hours = serializers.FloatField()
    gpu_hours = serializers.FloatField()
    allocation_pct = serializers.FloatField(allow_null=True)
    used_gpu_hours = serializers.FloatField()
    coverage_pct = serializers.FloatField(
        allow_null=True, help_text="The share of the week's allocated GPU-hours that had samples."
    )
    mean_util_pct = serializers.FloatField(
        allow_null=True, help_text="Mean utilisation over the covered GPU-hours only."
    )
    unmet_gpu_hours = serializers.FloatField(
        help_text="GPU-hours that waited while fewer GPUs were free than the job asked for."
    )


class BookingLineSerializer(serializers.Serializer):
    user = serializers.CharField(help_text="“lab” on the last row: the lab's totals.")
    bookings = serializers.IntegerField()
    booked_gpu_hours = serializers.FloatField()
    used_gpu_hours = serializers.FloatField()
    released_gpu_hours = serializers.FloatField()
    no_show_gpu_hours = serializers.FloatField()


class UsageReportSerializer(serializers.Serializer):
    period = PeriodSerializer()
    capacity_gpus = serializers.IntegerField()
    scoped_to = serializers.CharField(
        allow_null=True, help_text="For a member: their user name; only their own lines are in."
    )
    totals = UsageLineSerializer(many=True)
    user = UsageLineSerializer(many=True)
    category = UsageLineSerializer(many=True, required=False, help_text="Staff only.")
    queue = UsageLineSerializer(many=True)
    node = UsageLineSerializer(many=True)
    model = UsageLineSerializer(many=True)
    waits = WaitLineSerializer(many=True)
    weeks = WeekLineSerializer(many=True)
    bookings = BookingLineSerializer(many=True)


class ReplayOptionSerializer(serializers.Serializer):
    label = serializers.CharField(max_length=MAX_LABEL_CHARS, required=False, allow_blank=True)  # type: ignore[assignment]
    gpu_delta = serializers.IntegerField(required=False, default=0)
    gpu_model = serializers.CharField(
        max_length=MAX_GPU_MODEL_CHARS, required=False, allow_blank=True
    )
    policy_changes = serializers.DictField(
        child=serializers.FloatField(), required=False, help_text="weight_age, weight_fairshare, …"
    )


class ReportTaskCreateSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=ReportTask.Kind.choices)
    period = serializers.ChoiceField(choices=KINDS, required=False, default="month")
    at = serializers.DateField(required=False)
    from_ = serializers.DateField(required=False)
    to = serializers.DateField(required=False)
    language = serializers.ChoiceField(choices=["en", "zh-hans"], required=False, default="en")
    options = ReplayOptionSerializer(  # type: ignore[call-arg]  # many=True passes max_length on
        many=True, required=False, max_length=MAX_OPTIONS, help_text="Replays only."
    )

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        fields["from"] = fields.pop("from_")
        return fields


class ReportTaskSerializer(serializers.ModelSerializer):
    progress_pct = serializers.IntegerField(read_only=True)
    pdf_url = serializers.SerializerMethodField()

    class Meta:
        model = ReportTask
        fields = [
            "id",
            "kind",
            "state",
            "period_start",
            "period_end",
            "language",
            "params",
            "progress_done",
            "progress_total",
            "progress_pct",
            "result",
            "error",
            "created_at",
            "finished_at",
            "pdf_url",
        ]
        read_only_fields = fields

    def get_pdf_url(self, task: ReportTask) -> str | None:
        from django.urls import reverse

        if task.kind == ReportTask.Kind.PDF and task.state == ReportTask.State.DONE:
            return reverse("report_task_pdf", args=[task.pk])
        return None


class ApplyPolicySerializer(serializers.Serializer):
    option = serializers.IntegerField(min_value=0, help_text="Index of the replayed option.")

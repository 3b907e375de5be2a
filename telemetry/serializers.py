"""Query parameters and answers of the chart endpoints (they document the OpenAPI schema)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from rest_framework import serializers

from telemetry.selectors import DEFAULT_POINTS, MAX_POINTS

RANGES = {
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
    "365d": timedelta(days=365),
}


class GpuSeriesQuerySerializer(serializers.Serializer[Any]):
    range = serializers.ChoiceField(
        choices=list(RANGES),
        default="24h",
        help_text="How far back from now: 24h and 7d as on the GPUs page, up to 365d.",
    )
    node = serializers.SlugField(
        required=False, help_text="Only this node's GPUs (its name, e.g. gpu01)."
    )
    gpu = serializers.IntegerField(required=False, min_value=1, help_text="Only this GPU (its id).")
    points = serializers.IntegerField(
        default=DEFAULT_POINTS,
        min_value=10,
        max_value=MAX_POINTS,
        help_text="At most this many bins; wider bins merge rollup rows.",
    )


class LabDailyQuerySerializer(serializers.Serializer[Any]):
    days = serializers.IntegerField(
        default=30,
        min_value=1,
        max_value=3660,
        help_text="How many days back from today, today included.",
    )


class GpuLineSerializer(serializers.Serializer[Any]):
    gpu_id = serializers.IntegerField()
    label = serializers.CharField()  # type: ignore[assignment]  # a field, not Field.label
    node = serializers.CharField()
    memory_mb = serializers.IntegerField()
    util = serializers.ListField(
        child=serializers.FloatField(allow_null=True), help_text="Mean utilisation % per bin."
    )
    mem_used_mb = serializers.ListField(
        child=serializers.IntegerField(allow_null=True), help_text="Peak memory used per bin."
    )


class NodeLineSerializer(serializers.Serializer[Any]):
    node = serializers.CharField()
    memory_mb = serializers.IntegerField()
    util = serializers.ListField(child=serializers.FloatField(allow_null=True))
    mem_used_mb = serializers.ListField(child=serializers.IntegerField(allow_null=True))


class SeriesSerializer(serializers.Serializer[Any]):
    resolution = serializers.ChoiceField(
        choices=["minute", "hour"], help_text="The rollup the bins were made from."
    )
    step_s = serializers.IntegerField(help_text="Seconds per bin.")
    timestamps = serializers.ListField(
        child=serializers.IntegerField(), help_text="Start of each bin, Unix seconds."
    )
    gpus = GpuLineSerializer(many=True)
    nodes = NodeLineSerializer(many=True)
    simulated = serializers.BooleanField(help_text="True when a node's GPUs are simulated.")


class LabDaySerializer(serializers.Serializer[Any]):
    day = serializers.DateField()
    allocated_share = serializers.FloatField(
        allow_null=True, help_text="Share of GPU time held by jobs, 0 to 1."
    )
    util_mean = serializers.FloatField(allow_null=True, help_text="Mean real utilisation %.")
    gpu_hours = serializers.FloatField(help_text="GPU-hours held by jobs.")

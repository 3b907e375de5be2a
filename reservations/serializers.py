"""API shapes of the reservations."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.utils.translation import gettext_lazy as _
from rest_framework import serializers

from cluster.models import Node
from reservations.models import Reservation


class ReservationSerializer(serializers.ModelSerializer[Reservation]):
    user = serializers.CharField(source="user.username", read_only=True)
    gpus = serializers.SerializerMethodField()
    gpu_labels = serializers.SerializerMethodField()

    class Meta:
        model = Reservation
        fields = [
            "id",
            "user",
            "gpus",
            "gpu_labels",
            "start",
            "end",
            "state",
            "note",
            "is_maintenance",
            "charged",
            "credit_rate",
            "booked_end",
            "no_show",
            "created_at",
        ]
        read_only_fields = fields

    def get_gpus(self, reservation: Reservation) -> list[int]:
        return [g.pk for g in reservation.gpus.all()]

    def get_gpu_labels(self, reservation: Reservation) -> list[str]:
        return [g.label for g in reservation.gpus.all()]


class ReservationCreateSerializer(serializers.Serializer):
    gpus = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=2**63 - 1),
        required=False,
        allow_empty=False,
        max_length=512,
        help_text=_("Ids of whole GPUs; or give node and gpu_count instead."),
    )
    node = serializers.SlugRelatedField(
        slug_field="name", queryset=Node.objects.all(), required=False
    )
    gpu_count = serializers.IntegerField(min_value=1, max_value=64, required=False)
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    note = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    maintenance = serializers.BooleanField(required=False, default=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        has_gpus = bool(attrs.get("gpus"))
        has_node = attrs.get("node") is not None or attrs.get("gpu_count") is not None
        if has_gpus == has_node:
            raise serializers.ValidationError(_("Give either 'gpus', or 'node' and 'gpu_count'."))
        if has_node and (attrs.get("node") is None or attrs.get("gpu_count") is None):
            raise serializers.ValidationError(_("'node' and 'gpu_count' go together."))
        if attrs["end"] <= attrs["start"]:
            raise serializers.ValidationError({"end": _("The end must be after the start.")})
        return attrs


class ReservationExtendSerializer(serializers.Serializer):
    end = serializers.DateTimeField(help_text=_("The new end; later than the current one."))


class SuggestQuerySerializer(serializers.Serializer):
    gpu_count = serializers.IntegerField(min_value=1, max_value=64, default=1)
    hours = serializers.DecimalField(
        max_digits=6, decimal_places=2, min_value=Decimal("0.25"), max_value=Decimal("720")
    )
    node = serializers.SlugRelatedField(
        slug_field="name", queryset=Node.objects.all(), required=False
    )
    after = serializers.DateTimeField(required=False)


class FreeSlotSerializer(serializers.Serializer):
    node = serializers.CharField()
    gpus = serializers.ListField(child=serializers.IntegerField())
    gpu_labels = serializers.ListField(child=serializers.CharField())
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()

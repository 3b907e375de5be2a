from __future__ import annotations

from rest_framework import serializers

from accounts.models import LedgerEntry, Notification


class CreditSummarySerializer(serializers.Serializer):
    username = serializers.CharField()
    balance = serializers.DecimalField(max_digits=14, decimal_places=3)
    burn_per_day = serializers.DecimalField(max_digits=14, decimal_places=3)
    runs_out_at = serializers.DateTimeField(allow_null=True)
    next_grant_on = serializers.DateField()


class LedgerEntrySerializer(serializers.ModelSerializer[LedgerEntry]):
    username = serializers.CharField(source="account.user.username", read_only=True)
    kind_display = serializers.CharField(source="get_kind_display", read_only=True)

    class Meta:
        model = LedgerEntry
        fields = [
            "id",
            "username",
            "kind",
            "kind_display",
            "amount",
            "balance_after",
            "job",
            "reservation",
            "note",
            "created_at",
        ]
        read_only_fields = fields


class NotificationSerializer(serializers.ModelSerializer[Notification]):
    # In the reader's language, as the page shows them.
    title = serializers.CharField(source="local_title", read_only=True)
    body = serializers.CharField(source="local_body", read_only=True)

    class Meta:
        model = Notification
        fields = ["id", "kind", "title", "body", "url", "created_at", "read_at"]
        read_only_fields = fields

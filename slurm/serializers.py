from __future__ import annotations

from core.api_serializers import CachedFieldsModelSerializer
from slurm.models import SlurmJob


class SlurmJobSummarySerializer(CachedFieldsModelSerializer):
    """What Slurm reports about a portal job (Slurm mode only)."""

    class Meta:
        model = SlurmJob
        fields = [
            "slurm_job_id",
            "state",
            "reason",
            "estimated_start",
            "partition",
            "qos",
            "account",
            "unix_user",
            "nodes",
        ]
        read_only_fields = fields

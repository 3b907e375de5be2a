from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.utils.functional import lazy
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _
from rest_framework import serializers

from core.api_serializers import CachedFieldsModelSerializer, CheapCopySerializer
from jobqueue.arrays import MAX_ARRAY, array_indices
from jobqueue.dependencies import MAX_DEPENDENCIES, parse_dependency
from jobqueue.errors import JobRefused
from jobqueue.extensions import job_api_fields
from jobqueue.models import (
    MAX_COMMAND_ARGS,
    MAX_COMMAND_CHARS,
    MAX_ENV_VALUE_CHARS,
    Job,
    JobEvent,
    Queue,
    VolumeMount,
    command_limit_refusal,
    env_limit_refusal,
)
from jobqueue.submit import BATCH_TOO_LARGE, MAX_BATCH

MAX_INT32 = 2**31 - 1
MAX_BIGINT = 2**63 - 1


class QueueSerializer(CachedFieldsModelSerializer):
    # title and description in the reader's language (the other one where it is empty);
    # both stored values under their language's key.
    title = serializers.CharField(source="local_title", read_only=True)
    description = serializers.CharField(source="local_description", read_only=True)
    title_en = serializers.CharField(source="title", read_only=True)
    description_en = serializers.CharField(source="description", read_only=True)

    class Meta:
        model = Queue
        fields = [
            "name",
            "title",
            "description",
            "title_en",
            "title_zh_hans",
            "description_en",
            "description_zh_hans",
            "tier",
            "credit_rate",
            "max_gpus_per_job",
            "max_time_limit_s",
            "default_time_limit_s",
            "max_running_jobs_per_user",
            "max_running_gpus_per_user",
            "requires_grant",
            "allows_shared_slots",
        ]


class JobEventSerializer(CachedFieldsModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["kind", "message", "data", "created_at"]


class JobSerializer(CachedFieldsModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)
    queue = serializers.CharField(source="queue.name", read_only=True)
    image = serializers.CharField(source="image.reference", read_only=True)
    node = serializers.CharField(source="node.name", read_only=True, default=None, allow_null=True)
    gpu_uuids = serializers.SerializerMethodField()
    mounts: serializers.SlugRelatedField[VolumeMount] = serializers.SlugRelatedField(
        slug_field="name", many=True, read_only=True
    )
    pending_reason_text = serializers.CharField(read_only=True)
    project = serializers.CharField(
        source="project.name", read_only=True, default=None, allow_null=True
    )
    dependency = serializers.SerializerMethodField(
        help_text="The jobs it waits for, in Slurm's syntax (afterok:12:13, afterany:12); "
        "null when it waits for none."
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "kind",
            "owner",
            "queue",
            "image",
            "command",
            "env",
            "mounts",
            "gpus",
            "shared_slot",
            "min_gpu_memory_mb",
            "gpu_model",
            "cpus",
            "memory_mb",
            "time_limit_s",
            "preemptible",
            "reservation",
            "project",
            "state",
            "node",
            "gpu_uuids",
            "submitted_at",
            "started_at",
            "ended_at",
            "exit_code",
            "end_reason",
            "queue_position",
            "estimated_start",
            "pending_reason",
            "pending_reason_text",
            "predicted_runtime_s",
            "dependency",
            "array_id",
            "array_index",
            "slurm",
        ]
        read_only_fields = fields

    def extra_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        # Fields the apps above add (slurm/: "slurm", Slurm's own state, reason and
        # estimated start, null in agents mode).
        return {name: make_field() for name, make_field in job_api_fields().items()}

    def get_gpu_uuids(self, job: Job) -> list[str]:
        return [a.gpu.uuid for a in job.allocations.all()]

    def get_dependency(self, job: Job) -> str | None:
        if not job.dependency_kind:
            return None
        ids = sorted(dep.pk for dep in job.depends_on.all())
        return ":".join([job.dependency_kind, *map(str, ids)]) if ids else None


class JobSubmitSerializer(CheapCopySerializer):
    """What a script sends to submit a job; the service checks the lab's rules."""

    # Text fields are no longer than their columns (Queue.name, ContainerImage.reference,
    # VolumeMount.name): a longer one is refused at once, not looked up.
    queue = serializers.CharField(default="normal", max_length=32)
    image = serializers.CharField(max_length=255)
    command = serializers.JSONField(
        help_text="One string, run as typed by /bin/sh -c; or an argument list, run as is "
        f"(exec form). At most {MAX_COMMAND_CHARS} characters (a list: its arguments joined "
        f"by spaces) and {MAX_COMMAND_ARGS} arguments."
    )
    gpus = serializers.IntegerField(default=1, min_value=1, max_value=64)
    shared_slot = serializers.BooleanField(default=False)
    env = serializers.DictField(
        child=serializers.CharField(allow_blank=True, max_length=MAX_ENV_VALUE_CHARS), default=dict
    )
    mounts = serializers.ListField(
        child=serializers.CharField(max_length=40), default=list, max_length=100
    )
    # Upper bounds are those of the columns (PositiveIntegerField, BigAutoField), so
    # that a too-large number is a clear 400 and never reaches the database.
    time_limit_s = serializers.IntegerField(required=False, min_value=1, max_value=MAX_INT32)
    min_gpu_memory_mb = serializers.IntegerField(default=0, min_value=0, max_value=MAX_INT32)
    gpu_model = serializers.CharField(default="", allow_blank=True, max_length=120)
    cpus = serializers.DecimalField(
        default=Decimal("4"), max_digits=5, decimal_places=2, min_value=Decimal("0.1")
    )
    memory_mb = serializers.IntegerField(default=16384, min_value=64, max_value=MAX_INT32)
    name = serializers.CharField(default="", allow_blank=True, max_length=120)
    reservation = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_BIGINT
    )
    preemptible = serializers.BooleanField(default=False)
    project = serializers.CharField(
        default="",
        allow_blank=True,
        max_length=40,
        help_text="The short name of a project of yours (a grant, a shared project) to charge "
        "the GPU time to; the usage report has a table per project. Empty: none.",
    )
    dependency = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=1000,
        help_text="Start only after other jobs of yours, in Slurm's syntax: afterok:12:13 "
        "(after jobs 12 and 13 have completed with exit code 0) or afterany:12 (after job 12 "
        f"has ended, however). At most {MAX_DEPENDENCIES} jobs. A job whose afterok "
        "dependency fails, is cancelled, times out or is lost is cancelled with the end "
        "reason dependency_failed.",
    )

    def validate_dependency(self, value: str) -> tuple[str, list[int]] | None:
        if not value.strip():
            return None
        try:
            return parse_dependency(value)
        except JobRefused as refusal:
            raise serializers.ValidationError(str(refusal.message)) from None

    def validate_env(self, value: dict[str, str]) -> dict[str, str]:
        refusal = env_limit_refusal(value)
        if refusal is not None:
            raise serializers.ValidationError(refusal)
        return value

    def validate_command(self, value: Any) -> Any:
        # Measured before anything walks the list: a million arguments is refused at once.
        if isinstance(value, str | list):
            refusal = command_limit_refusal(value)
            if refusal is not None:
                raise serializers.ValidationError(refusal)
        if isinstance(value, str) or (
            isinstance(value, list) and all(isinstance(p, str | int | float) for p in value)
        ):
            parts = [value] if isinstance(value, str) else [str(p) for p in value]
            if any("\x00" in part for part in parts):
                raise serializers.ValidationError(
                    _("The command contains a NUL character (\\0); remove it.")
                )
            return value
        raise serializers.ValidationError(
            _("Give the command as a list of strings or as one string.")
        )


class JobArraySerializer(JobSubmitSerializer):
    """One job's fields and the indices of its array: one job per index, queued together."""

    array = serializers.CharField(
        max_length=10000,
        help_text=f"The indices: 0-9, 1,4,7 or 0-3,10; at most {MAX_ARRAY} jobs. Each job is told its "
        "index in LABPORTAL_ARRAY_INDEX, and a named array's jobs are called name[index].",
    )

    def validate_array(self, value: str) -> list[int]:
        try:
            return array_indices(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None


class JobArrayCreatedSerializer(serializers.Serializer[Any]):
    """What an array's submit answers: the array's id (its first job's) and every job's id."""

    array_id = serializers.IntegerField()
    queue = serializers.CharField()
    count = serializers.IntegerField()
    ids = serializers.ListField(child=serializers.IntegerField())
    indices = serializers.ListField(child=serializers.IntegerField())


def _batch_too_large_text() -> str:
    return gettext(BATCH_TOO_LARGE) % {"max": MAX_BATCH}


# In the language of the request that is refused, not of the import.
_batch_too_large = lazy(_batch_too_large_text, str)


class JobBatchSerializer(serializers.Serializer[Any]):
    """Many jobs in one request, queued together or not at all."""

    # Counted before any job is validated: a batch of a million is refused at once.
    jobs = JobSubmitSerializer(  # type: ignore[call-arg]  # many=True passes max_length on
        many=True,
        allow_empty=False,
        max_length=MAX_BATCH,
        error_messages={"max_length": _batch_too_large()},
    )


class QueueEntrySerializer(serializers.Serializer[Any]):
    """A job as every member may see it in the queue: owner, size and queue, never command or env."""

    id = serializers.IntegerField(source="pk")
    owner = serializers.CharField(source="owner.username")
    queue = serializers.CharField(source="queue.name")
    gpus = serializers.IntegerField()
    shared_slot = serializers.BooleanField()
    state = serializers.CharField()
    queue_position = serializers.IntegerField(allow_null=True)
    estimated_start = serializers.DateTimeField(allow_null=True)
    pending_reason = serializers.CharField()
    pending_reason_text = serializers.CharField()
    started_at = serializers.DateTimeField(allow_null=True)
    expected_end = serializers.DateTimeField(allow_null=True)

"""Saved job templates: a member's own submit forms, kept by name. Lab-wide ones (no
owner) are made in the admin. A template is only pre-filled form data: the form and the
submit service check it again when it is submitted."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from accounts.models import User
from jobqueue.models import JobTemplate

# The submit form's fields a template keeps; a booking is for one time slot, so not it.
TEMPLATE_FIELDS = (
    "name",
    "queue",
    "image",
    "command",
    "array",
    "gpus",
    "shared_slot",
    "time_limit_hours",
    "gpu_model",
    "min_gpu_memory_gb",
    "cpus",
    "memory_gb",
    "env",
    "mounts",
    "preemptible",
)


@transaction.atomic
def job_template_save(
    *, owner: User, name: str, fields: dict[str, Any]
) -> tuple[JobTemplate, bool]:
    """Keep `fields` as `owner`'s template `name`, replacing one of that name; True if new."""
    kept = {k: v for k, v in fields.items() if k in TEMPLATE_FIELDS}
    template, created = JobTemplate.objects.select_for_update().get_or_create(
        owner=owner, name=name.strip(), defaults={"fields": kept}
    )
    if not created:
        template.fields = kept
        template.save(update_fields=["fields", "updated_at"])
    return template, created

"""The guided first job: the lab-wide "Hello GPU" job template.

The script is deploy/images/hello-gpu/hello_gpu.py, the same file the sample image
carries. The template runs it from the job's own script (a here-document), so it needs
only python3: it runs in the demo's local runtime as on a real node's container.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.db import transaction

from jobqueue.models import ContainerImage, JobTemplate, Queue

TEMPLATE_NAME = "Hello GPU"
SCRIPT = Path(settings.BASE_DIR) / "deploy" / "images" / "hello-gpu" / "hello_gpu.py"


def hello_gpu_command() -> str:
    """The job's script: the hello-GPU program fed to python3 as a here-document."""
    return (
        "# Hello GPU: prints the GPUs this job got, then a few seconds of work.\n"
        "python3 - <<'HELLO_GPU'\n"
        + SCRIPT.read_text(encoding="utf-8").rstrip("\n")
        + "\nHELLO_GPU\n"
    )


@transaction.atomic
def hello_gpu_template_ensure(*, image: str, queue: str = "debug") -> JobTemplate:
    """Make or refresh the lab-wide template on `queue` with `image` (allowlisted if new)."""
    if not Queue.objects.filter(name=queue, is_active=True).exists():
        open_queues = ", ".join(Queue.objects.filter(is_active=True).values_list("name", flat=True))
        raise ValueError(
            f"There is no open queue {queue!r}; pass --queue with one of: {open_queues or '(none)'}."
        )
    ContainerImage.objects.get_or_create(
        reference=image,
        defaults={"description": "The guided first job (deploy/images/hello-gpu)."},
    )
    fields = {
        "name": "hello-gpu",
        "queue": queue,
        "image": image,
        "command": hello_gpu_command(),
        "gpus": 1,
        "time_limit_hours": 0.25,
        "cpus": 1,
        "memory_gb": 1,
    }
    template, _created = JobTemplate.objects.update_or_create(
        owner=None, name=TEMPLATE_NAME, defaults={"fields": fields}
    )
    return template


def hello_gpu_template() -> JobTemplate | None:
    return JobTemplate.objects.filter(owner=None, name=TEMPLATE_NAME).first()

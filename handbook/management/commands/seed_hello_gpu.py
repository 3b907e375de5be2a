"""Make (or refresh) the lab-wide "Hello GPU" job template for a training session."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from handbook.hello_gpu import hello_gpu_template_ensure


class Command(BaseCommand):
    help = (
        "Make the lab-wide 'Hello GPU' job template (docs/manual/en/admin-training.md); "
        "idempotent, and refreshes its script."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--image",
            default="lab/hello-gpu",
            help="Image the job runs in: build deploy/images/hello-gpu under this name "
            "(added to the allowlist if it is not there). Default: lab/hello-gpu.",
        )
        parser.add_argument("--queue", default="debug", help="Queue of the job. Default: debug.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            template = hello_gpu_template_ensure(image=options["image"], queue=options["queue"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"Lab-wide job template {template.name!r} ready "
            f"(image {options['image']}, queue {options['queue']})."
        )

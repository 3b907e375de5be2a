"""Issue a scrape token for Prometheus and print it once (the admin can do the same)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from telemetry.models import ScrapeToken


class Command(BaseCommand):
    help = "Issue a /metrics scrape token and print it; put it in Prometheus' credentials file."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--name", default="prometheus", help="which Prometheus uses it")

    def handle(self, *args: Any, **options: Any) -> None:
        _token, secret = ScrapeToken.issue(name=options["name"])
        self.stdout.write(secret)

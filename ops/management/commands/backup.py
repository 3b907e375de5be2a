"""manage.py backup: one archive of the database and uploaded files, then retention."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ops import backups


class Command(BaseCommand):
    help = (
        "Back up the database (pg_dump custom format, or SQLite's online backup) and uploaded "
        "files into a dated, checksummed archive in LABPORTAL_BACKUP_DIR, then delete the "
        "archives that retention (LABPORTAL_BACKUP_KEEP_DAILY/WEEKLY/MONTHLY) does not keep."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dir", type=Path, help="write here instead of LABPORTAL_BACKUP_DIR")
        parser.add_argument("--no-prune", action="store_true", help="keep every older archive")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            archive = backups.backup_create(directory=options["dir"])
        except backups.BackupError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"backup written: {archive.path}")
        if not options["no_prune"]:
            for path in backups.backup_prune(directory=options["dir"]):
                self.stdout.write(f"retention deleted: {path}")

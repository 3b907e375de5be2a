"""manage.py restore ARCHIVE: verify an archive's checksum, then restore it into an empty database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ops import backups


class Command(BaseCommand):
    help = (
        "Restore a backup archive made by `manage.py backup` into this portal's database "
        "(DATABASE_URL). The checksum is verified first; a database that is not empty is "
        "refused unless --force."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("archive", type=Path, help="the .tar archive (its .sha256 beside it)")
        parser.add_argument(
            "--force",
            action="store_true",
            help="delete everything in the database first (when it is not empty)",
        )
        parser.add_argument(
            "--verify-only", action="store_true", help="check the archive, restore nothing"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["verify_only"]:
                manifest = backups.verify_archive(options["archive"])
            else:
                manifest = backups.backup_restore(path=options["archive"], force=options["force"])
        except backups.BackupError as exc:
            raise CommandError(str(exc)) from exc
        verb = "verified" if options["verify_only"] else "restored"
        self.stdout.write(
            f"{verb}: {options['archive']} ({manifest['engine']} backup of {manifest['created']})"
        )

"""Backups of the portal: a consistent database dump plus uploaded files, in one dated,
checksummed archive, with daily/weekly/monthly retention; and the restore of such an archive.

An archive is ``labportal-YYYYMMDDTHHMMSSZ.tar`` with a ``.sha256`` file beside it. Inside:
``manifest.json`` (engine, time, the sha256 of every member), ``database.dump``
(``pg_dump`` custom format) or ``database.sqlite3`` (SQLite's online backup API), and
``media/`` when the portal keeps uploaded files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric

from core.errors import DomainError

ARCHIVE_PREFIX = "labportal-"
ARCHIVE_SUFFIX = ".tar"
STAMP_FORMAT = "%Y%m%dT%H%M%SZ"
FORMAT_VERSION = 1
# A backup older than this is overdue: staff are notified and the page header says so.
STALE_AFTER = timedelta(hours=26)


class BackupError(DomainError):
    """A backup or restore could not be done; the message says why and what to do."""


@dataclass(frozen=True)
class Archive:
    path: Path
    created: datetime

    @property
    def checksum_path(self) -> Path:
        return self.path.with_name(self.path.name + ".sha256")


def backup_dir() -> Path:
    return Path(settings.LABPORTAL_BACKUP_DIR)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _pg_env_and_args() -> tuple[dict[str, str], list[str]]:
    db = connection.settings_dict
    env = {**os.environ}
    if db.get("PASSWORD"):
        env["PGPASSWORD"] = str(db["PASSWORD"])
    args = ["--host", str(db.get("HOST") or "127.0.0.1"), "--port", str(db.get("PORT") or 5432)]
    args += ["--username", str(db.get("USER") or "postgres"), "--dbname", str(db["NAME"])]
    return env, args


def _run(command: list[str], env: dict[str, str], what: str) -> None:
    if shutil.which(command[0]) is None:
        raise BackupError(
            f"{command[0]} is not installed; install PostgreSQL's client tools "
            "(Debian: apt-get install postgresql-client) to back up or restore PostgreSQL"
        )
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise BackupError(f"{what} failed: {result.stderr.strip()[-2000:]}")


def _dump_database(target_dir: Path) -> str:
    if connection.vendor == "postgresql":
        env, args = _pg_env_and_args()
        # Custom format: one consistent snapshot (pg_dump runs in one transaction).
        _run(
            [
                "pg_dump",
                "--format=custom",
                "--no-owner",
                "--no-privileges",
                *args,
                "--file",
                str(target_dir / "database.dump"),
            ],
            env,
            "pg_dump",
        )
        return "database.dump"
    connection.ensure_connection()
    with sqlite3.connect(target_dir / "database.sqlite3") as target:
        # The online backup API copies a consistent snapshot while others keep writing.
        connection.connection.backup(target)
    return "database.sqlite3"


def _media_root() -> Path | None:
    root = getattr(settings, "MEDIA_ROOT", "")
    if root and Path(root).is_dir() and any(Path(root).iterdir()):
        return Path(root)
    return None


def backup_create(*, now: datetime | None = None, directory: Path | None = None) -> Archive:
    """Write one archive (database + media) into the backup folder, atomically, and its checksum."""
    now = now or timezone.now()
    directory = directory or backup_dir()
    directory.mkdir(parents=True, exist_ok=True)
    name = f"{ARCHIVE_PREFIX}{now.astimezone(UTC).strftime(STAMP_FORMAT)}{ARCHIVE_SUFFIX}"
    final = directory / name
    with tempfile.TemporaryDirectory(dir=directory, prefix=".work-") as work_name:
        work = Path(work_name)
        members = [_dump_database(work)]
        media = _media_root()
        manifest: dict[str, Any] = {
            "format": FORMAT_VERSION,
            "created": now.astimezone(UTC).isoformat(),
            "engine": connection.vendor,
            "files": {m: _sha256(work / m) for m in members},
            "media": media is not None,
        }
        (work / "manifest.json").write_text(json.dumps(manifest, indent=2))
        partial = work / (name + ".partial")
        with tarfile.open(partial, "w") as tar:
            tar.add(work / "manifest.json", arcname="manifest.json")
            for member in members:
                tar.add(work / member, arcname=member)
            if media is not None:
                tar.add(media, arcname="media")
        # The archive holds every member's data and token hashes: only its owner reads it
        # (it was written with the umask's 0644). The folder we write in is 0700.
        partial.chmod(0o600)
        checksum = _sha256(partial)
        partial.replace(final)
    archive = Archive(path=final, created=now)
    archive.checksum_path.write_text(f"{checksum}  {name}\n")
    return archive


def _parse_created(path: Path) -> datetime | None:
    stamp = path.name.removeprefix(ARCHIVE_PREFIX).removesuffix(ARCHIVE_SUFFIX)
    try:
        return datetime.strptime(stamp, STAMP_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None


def archives_in(directory: Path | None = None) -> list[Archive]:
    """The complete archives in the folder (with their checksum file), newest first."""
    directory = directory or backup_dir()
    if not directory.is_dir():
        return []
    found = []
    for path in directory.glob(f"{ARCHIVE_PREFIX}*{ARCHIVE_SUFFIX}"):
        created = _parse_created(path)
        if created is not None and path.with_name(path.name + ".sha256").exists():
            found.append(Archive(path=path, created=created))
    return sorted(found, key=lambda a: a.created, reverse=True)


def last_backup(directory: Path | None = None) -> Archive | None:
    archives = archives_in(directory)
    return archives[0] if archives else None


def backup_is_stale(*, now: datetime | None = None, directory: Path | None = None) -> bool:
    newest = last_backup(directory)
    return newest is None or (now or timezone.now()) - newest.created > STALE_AFTER


def archives_to_keep(
    created: Iterable[datetime], *, daily: int, weekly: int, monthly: int
) -> set[datetime]:
    """Grandfather-father-son: the newest archive of each of the last `daily` days, `weekly`
    ISO weeks and `monthly` months that have an archive. The newest archive is always kept."""
    ordered = sorted(created, reverse=True)
    keep: set[datetime] = set(ordered[:1])
    periods = (
        (daily, lambda t: t.date()),
        (weekly, lambda t: t.isocalendar()[:2]),
        (monthly, lambda t: (t.year, t.month)),
    )
    for count, period_of in periods:
        seen: list[object] = []
        for stamp in ordered:
            period = period_of(stamp)
            if period in seen:
                continue
            if len(seen) >= count:
                break
            seen.append(period)
            keep.add(stamp)
    return keep


def backup_prune(*, directory: Path | None = None) -> list[Path]:
    """Delete the archives retention does not keep; return what was deleted."""
    archives = archives_in(directory)
    keep = archives_to_keep(
        (a.created for a in archives),
        daily=settings.LABPORTAL_BACKUP_KEEP_DAILY,
        weekly=settings.LABPORTAL_BACKUP_KEEP_WEEKLY,
        monthly=settings.LABPORTAL_BACKUP_KEEP_MONTHLY,
    )
    deleted = []
    for archive in archives:
        if archive.created not in keep:
            archive.path.unlink(missing_ok=True)
            archive.checksum_path.unlink(missing_ok=True)
            deleted.append(archive.path)
    return deleted


def verify_archive(path: Path) -> dict[str, Any]:
    """Check the archive against its .sha256 file and its manifest; return the manifest."""
    if not path.is_file():
        raise BackupError(f"{path} does not exist or is not a file")
    checksum_path = path.with_name(path.name + ".sha256")
    if not checksum_path.is_file():
        raise BackupError(
            f"{checksum_path.name} is missing next to the archive; copy it along with the "
            "archive (it is how a damaged copy is detected)"
        )
    expected = checksum_path.read_text().split()[0] if checksum_path.read_text().strip() else ""
    actual = _sha256(path)
    if actual != expected:
        raise BackupError(
            f"{path.name} is damaged: its sha256 is {actual}, but {checksum_path.name} says "
            f"{expected}. Restore from another copy of the archive."
        )
    try:
        with tarfile.open(path) as tar:
            source = tar.extractfile("manifest.json")
            manifest: dict[str, Any] = json.loads(source.read()) if source else {}
    except (tarfile.TarError, KeyError, ValueError) as exc:
        raise BackupError(f"{path.name} is not a LabPortal backup archive ({exc})") from exc
    if manifest.get("format") != FORMAT_VERSION:
        raise BackupError(f"{path.name} has an unknown format {manifest.get('format')!r}")
    return manifest


def user_tables() -> list[str]:
    return [t for t in connection.introspection.table_names() if not t.startswith("sqlite_")]


def database_is_empty() -> bool:
    return not user_tables()


def _drop_everything() -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
        return
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA foreign_keys = OFF")
        for table in user_tables():
            cursor.execute(f'DROP TABLE IF EXISTS "{table}"')


def _extract(tar: tarfile.TarFile, into: Path) -> None:
    for member in tar.getmembers():
        relative = Path(member.name)
        if (
            relative.is_absolute()
            or ".." in relative.parts
            or not (member.isfile() or member.isdir())
        ):
            raise BackupError(f"the archive holds an unsafe entry {member.name!r}; refusing it")
        if member.isdir():
            (into / relative).mkdir(parents=True, exist_ok=True)
            continue
        source = tar.extractfile(member)
        assert source is not None
        (into / relative).parent.mkdir(parents=True, exist_ok=True)
        with (into / relative).open("wb") as target:
            shutil.copyfileobj(source, target)


def backup_restore(*, path: Path, force: bool = False) -> dict[str, Any]:
    """Restore an archive into this portal's database (and media folder).

    The checksum is verified first. A database that already has tables is refused
    unless `force`, which drops everything in it first.
    """
    manifest = verify_archive(path)
    if manifest["engine"] != connection.vendor:
        raise BackupError(
            f"{path.name} is a {manifest['engine']} backup, but this portal's database is "
            f"{connection.vendor}; set DATABASE_URL to a {manifest['engine']} database"
        )
    if not database_is_empty() and not force:
        raise BackupError(
            "the database is not empty; restore into a new, empty database, or pass --force "
            "to delete everything in this one first"
        )
    with tempfile.TemporaryDirectory(prefix="labportal-restore-") as work_name:
        work = Path(work_name)
        with tarfile.open(path) as tar:
            _extract(tar, work)
        for member, digest in manifest["files"].items():
            if _sha256(work / member) != digest:
                raise BackupError(f"{member} in {path.name} does not match its manifest")
        if not database_is_empty():
            _drop_everything()
        if manifest["engine"] == "postgresql":
            env, args = _pg_env_and_args()
            connection.close()
            _run(
                [
                    "pg_restore",
                    "--no-owner",
                    "--no-privileges",
                    "--exit-on-error",
                    *args,
                    str(work / "database.dump"),
                ],
                env,
                "pg_restore",
            )
        else:
            connection.ensure_connection()
            with sqlite3.connect(work / "database.sqlite3") as source:
                source.backup(connection.connection)
        if manifest.get("media") and (work / "media").is_dir():
            media_root = Path(settings.MEDIA_ROOT)
            media_root.mkdir(parents=True, exist_ok=True)
            shutil.copytree(work / "media", media_root, dirs_exist_ok=True)
    return manifest


def backup_notify_if_stale(*, now: datetime) -> int:
    """Tell every active staff member, once a day, that no backup succeeded for a day."""
    from django.utils.translation import gettext as _
    from django.utils.translation import gettext_lazy

    from accounts.models import User
    from accounts.services import in_language_of, notify

    if not backup_is_stale(now=now):
        return 0
    newest = last_backup()
    staff = list(User.objects.filter(is_staff=True, is_active=True))
    for user in staff:
        with in_language_of(user):
            body = (
                _("The last successful backup was made at %(when)s UTC.")
                % {"when": newest.created.strftime("%Y-%m-%d %H:%M")}
                if newest
                else _("No backup has been made yet.")
            )
        notify(
            user=user,
            kind="backup_stale",
            title=gettext_lazy("No backup has succeeded for a day"),
            body=body,
            url="/help/admin-backups/",
            dedupe_key=f"backup-stale-{now.date().isoformat()}",
        )
    return len(staff)


class BackupCollector:
    """Prometheus gauges of the backups: when the newest archive was made, and how many are kept.

    Registered for /metrics in OpsConfig.ready(); an alert on
    ``time() - labportal_backup_last_success_timestamp_seconds > 93600`` pages the admins.
    """

    def collect(self) -> Iterator[Metric]:
        archives = archives_in()
        last = GaugeMetricFamily(
            "labportal_backup_last_success_timestamp_seconds",
            "Unix time of the newest complete backup archive (0 when there is none).",
        )
        last.add_metric([], archives[0].created.timestamp() if archives else 0.0)
        yield last
        count = GaugeMetricFamily(
            "labportal_backup_archives", "Backup archives kept in LABPORTAL_BACKUP_DIR."
        )
        count.add_metric([], len(archives))
        yield count

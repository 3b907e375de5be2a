"""Backups: an archive restores every table exactly; damage and non-empty databases are refused;
retention keeps exactly the GFS set; a missing backup raises a staff notification."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.core.management import CommandError, call_command
from django.db import connection

from accounts.models import Notification, User
from jobqueue.submit import job_submit
from ops import backups
from tests.factories import ContainerImageFactory, UserFactory, make_cluster


def every_table() -> dict[str, list[tuple[Any, ...]]]:
    """Each table's rows, order-independent: what a restore must reproduce exactly."""
    tables = {}
    with connection.cursor() as cursor:
        for table in sorted(backups.user_tables()):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            tables[table] = sorted(cursor.fetchall(), key=repr)
    return tables


def seed_lab(alice: Any) -> None:
    make_cluster(nodes=1, gpus_per_node=2)
    ContainerImageFactory()
    for i in range(3):
        job_submit(
            owner=alice,
            queue="normal",
            image="labportal/busybox:test",
            command=f"echo {i}",
            name=f"seed-{i}",
        )


@pytest.mark.django_db(transaction=True)
def test_a_backup_restored_after_dropping_everything_reproduces_every_table(
    alice: Any, admin_user: Any, queues: Any, tmp_path: Path, settings: Any
) -> None:
    settings.MEDIA_ROOT = tmp_path / "media"
    (tmp_path / "media" / "avatars").mkdir(parents=True)
    (tmp_path / "media" / "avatars" / "alice.png").write_bytes(b"\x89PNG fake")
    seed_lab(alice)
    before = every_table()
    assert sum(len(rows) for rows in before.values()) > 20

    archive = backups.backup_create(directory=tmp_path / "backups")
    assert archive.checksum_path.read_text().split()[0] == backups._sha256(archive.path)

    backups._drop_everything()
    assert backups.database_is_empty()
    (tmp_path / "media" / "avatars" / "alice.png").unlink()

    out = call_command_output("restore", str(archive.path))
    assert "restored" in out
    assert every_table() == before
    assert (tmp_path / "media" / "avatars" / "alice.png").read_bytes() == b"\x89PNG fake"
    # Sequences came back too: new rows do not collide with restored ones.
    assert UserFactory.create(username="after-restore").pk > max(
        u.pk for u in User.objects.exclude(username="after-restore")
    )


@pytest.mark.django_db(transaction=True)
def test_restore_refuses_a_database_that_is_not_empty_unless_forced(
    alice: Any, queues: Any, tmp_path: Path
) -> None:
    archive = backups.backup_create(directory=tmp_path)
    UserFactory(username="made-after-the-backup")

    with pytest.raises(CommandError, match="the database is not empty"):
        call_command("restore", str(archive.path))
    assert User.objects.filter(username="made-after-the-backup").exists()

    call_command_output("restore", str(archive.path), "--force")
    assert not User.objects.filter(username="made-after-the-backup").exists()
    assert User.objects.filter(username="alice").exists()


@pytest.mark.django_db(transaction=True)
def test_a_damaged_archive_is_refused_with_a_clear_message_and_nothing_changes(
    alice: Any, tmp_path: Path
) -> None:
    archive = backups.backup_create(directory=tmp_path)
    data = bytearray(archive.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    archive.path.write_bytes(bytes(data))
    before = every_table()

    with pytest.raises(
        CommandError, match=r"is damaged: its sha256 is .* Restore from another copy"
    ):
        call_command("restore", str(archive.path), "--force")
    assert every_table() == before

    archive.checksum_path.unlink()
    with pytest.raises(CommandError, match=r"\.sha256 is missing"):
        call_command("restore", str(archive.path), "--verify-only")


def test_retention_keeps_the_newest_of_each_day_week_and_month() -> None:
    now = datetime(2026, 12, 1, 3, 7, tzinfo=UTC)
    # One archive a night for 400 nights, plus a second one on the latest night.
    stamps = [now - timedelta(days=d) for d in range(400)] + [now - timedelta(hours=1)]

    kept = backups.archives_to_keep(stamps, daily=7, weekly=4, monthly=6)

    days = {now - timedelta(days=d) for d in range(7)}
    # The newest archive of the 4 latest ISO weeks: this week's is today's; then Sundays.
    sundays = {datetime(2026, 11, 29, 3, 7, tzinfo=UTC) - timedelta(weeks=w) for w in range(3)}
    # The newest of the 6 latest months: today (Dec) and the last day of Nov..Jul.
    month_ends = {
        datetime(2026, m, d, 3, 7, tzinfo=UTC)
        for m, d in ((11, 30), (10, 31), (9, 30), (8, 31), (7, 31))
    }
    assert kept == days | sundays | month_ends
    # 29 Nov (a Sunday) and 30 Nov (November's newest) are also among the 7 days.
    assert len(kept) == 7 + 2 + 4


def test_prune_deletes_exactly_the_archives_retention_does_not_keep(
    tmp_path: Path, settings: Any
) -> None:
    settings.LABPORTAL_BACKUP_KEEP_DAILY = 2
    settings.LABPORTAL_BACKUP_KEEP_WEEKLY = 0
    settings.LABPORTAL_BACKUP_KEEP_MONTHLY = 1
    now = datetime(2026, 12, 1, 3, 7, tzinfo=UTC)
    for days in range(5):
        stamp = (now - timedelta(days=days)).strftime(backups.STAMP_FORMAT)
        (tmp_path / f"labportal-{stamp}.tar").write_bytes(b"x")
        (tmp_path / f"labportal-{stamp}.tar.sha256").write_text("0  x\n")
    (tmp_path / "notes.txt").write_text("not an archive: left alone")

    deleted = backups.backup_prune(directory=tmp_path)

    remaining = sorted(p.name for p in tmp_path.iterdir())
    assert remaining == [
        "labportal-20261130T030700Z.tar",
        "labportal-20261130T030700Z.tar.sha256",
        "labportal-20261201T030700Z.tar",
        "labportal-20261201T030700Z.tar.sha256",
        "notes.txt",
    ]
    assert len(deleted) == 3


@pytest.mark.django_db
def test_an_overdue_backup_notifies_staff_once_a_day_and_members_never(
    alice: Any, admin_user: Any, tmp_path: Path, settings: Any
) -> None:
    settings.LABPORTAL_BACKUP_DIR = tmp_path
    now = datetime(2026, 12, 1, 1, 0, tzinfo=UTC)
    (tmp_path / "labportal-20261130T030700Z.tar").write_bytes(b"x")
    (tmp_path / "labportal-20261130T030700Z.tar.sha256").write_text("0  x\n")

    assert backups.backup_notify_if_stale(now=now) == 0  # 22 hours old: not overdue yet
    later = now + timedelta(hours=6)  # 28 hours old
    assert backups.backup_notify_if_stale(now=later) == 1
    assert backups.backup_notify_if_stale(now=later + timedelta(hours=1)) == 1

    notes = Notification.objects.filter(kind="backup_stale")
    assert [n.user.username for n in notes] == ["admin"]
    assert "2026-11-30 03:07" in notes[0].body


def call_command_output(*args: str) -> str:
    from io import StringIO

    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_the_metric_and_the_staff_page_show_the_last_successful_backup(
    alice: Any, admin_user: Any, tmp_path: Path, settings: Any
) -> None:
    from django.test import Client
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    settings.LABPORTAL_BACKUP_DIR = tmp_path
    registry = CollectorRegistry()
    registry.register(backups.BackupCollector())

    def exposed() -> dict[str, float]:
        text = generate_latest(registry).decode()
        return {m.name: m.samples[0].value for m in text_string_to_metric_families(text)}

    assert exposed()["labportal_backup_last_success_timestamp_seconds"] == 0
    archive = backups.backup_create(now=datetime(2026, 12, 1, 3, 7, tzinfo=UTC))
    assert exposed() == {
        "labportal_backup_last_success_timestamp_seconds": archive.created.timestamp(),
        "labportal_backup_archives": 1,
    }

    staff, member = Client(), Client()
    staff.force_login(admin_user)
    member.force_login(alice)
    assert "Last backup: 2026-12-01 03:07" in staff.get("/").content.decode()
    assert 'data-testid="backup-status"' not in member.get("/").content.decode()
    # Where nightly backups are on, an overdue one is flagged to staff on every page.
    settings.LABPORTAL_BACKUP_ENABLED = True
    with time_machine.travel(archive.created + timedelta(hours=20), tick=False):
        assert "Backups are overdue" not in staff.get("/jobs/").content.decode()
    with time_machine.travel(archive.created + timedelta(hours=30), tick=False):
        assert "Backups are overdue" in staff.get("/jobs/").content.decode()


def test_beat_runs_the_nightly_backup_at_the_configured_hour_and_checks_hourly() -> None:
    from ops.beat import backup_beat_schedule

    schedule = backup_beat_schedule(hour=2)
    nightly = schedule["backup-nightly"]["schedule"]
    assert schedule["backup-nightly"]["task"] == "control.backup_nightly"
    assert nightly.hour == {2} and nightly.minute == {7}  # type: ignore[attr-defined]
    assert schedule["backup-check-freshness"]["task"] == "control.backup_check_freshness"


@pytest.mark.django_db(transaction=True)
def test_the_nightly_task_writes_an_archive_and_applies_retention(
    alice: Any, tmp_path: Path, settings: Any
) -> None:
    from ops.tasks import backup_nightly_task

    settings.LABPORTAL_BACKUP_DIR = tmp_path
    settings.LABPORTAL_BACKUP_KEEP_DAILY = 1
    settings.LABPORTAL_BACKUP_KEEP_WEEKLY = 0
    settings.LABPORTAL_BACKUP_KEEP_MONTHLY = 0
    old = backups.backup_create(now=datetime(2026, 1, 5, 3, 7, tzinfo=UTC))

    written = Path(backup_nightly_task())

    assert written.is_file() and backups.verify_archive(written)["engine"] == connection.vendor
    assert not old.path.exists() and not old.checksum_path.exists()


@pytest.mark.django_db(transaction=True)
def test_an_archive_is_readable_by_its_owner_only(alice: Any, queues: Any, tmp_path: Path) -> None:
    archive = backups.backup_create(directory=tmp_path)
    assert archive.path.stat().st_mode & 0o777 == 0o600

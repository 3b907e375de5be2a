"""A database made on commit ef3479f's schema, with the demo lab in it, migrates forward on
today's code and loses nothing: every table stays, no table has fewer rows, and every row's
values in the columns that are still there are unchanged (besides the changes listed below).

The fixture ``fixtures/schema_ef3479f.sql.gz`` is the SQL text of that database. To make
it again (from the repository root; about 20 s)::

    git worktree add --detach /tmp/old ef3479f && ln -s "$PWD/.venv" /tmp/old/.venv
    cd /tmp/old && export DATABASE_URL=sqlite:////tmp/old/fixture.sqlite3
    .venv/bin/python manage.py migrate --noinput
    .venv/bin/python manage.py seed_demo && .venv/bin/python manage.py seed_demo_history
    .venv/bin/python manage.py shell -c "from django.contrib.auth import get_user_model; \\
        from reservations.models import CalendarFeed; \\
        [CalendarFeed.for_user(get_user_model().objects.get(username=n)) \\
         for n in ('alice', 'bob', 'admin')]"
    cd - && sqlite3 /tmp/old/fixture.sqlite3 .dump | gzip -9 \\
        > tests/architecture/fixtures/schema_ef3479f.sql.gz
    git worktree remove --force /tmp/old

The migrations run in a subprocess on a SQLite file of their own, so the test database of
the suite is not touched.
"""

from __future__ import annotations

import gzip
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "fixtures" / "schema_ef3479f.sql.gz"

# Columns a migration since ef3479f drops or renames on purpose; every other column of an
# old table keeps its name and its values.
DROPPED_COLUMNS: dict[str, set[str]] = {
    # reservations 0003: the plaintext token becomes `secret`, and every feed a fresh one.
    "reservations_calendarfeed": {"token"},
}


class Migrated(NamedTuple):
    before: Path
    after: Path
    env: dict[str, str]
    output: str


def _tables(db: sqlite3.Connection) -> set[str]:
    rows = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {name for (name,) in rows if not name.startswith("sqlite_")}


def _columns(db: sqlite3.Connection, table: str, schema: str = "main") -> list[str]:
    return [row[1] for row in db.execute(f'PRAGMA {schema}.table_info("{table}")')]


def _count(db: sqlite3.Connection, table: str, schema: str = "main") -> int:
    return db.execute(f'SELECT COUNT(*) FROM {schema}."{table}"').fetchone()[0]


def _ledger_sums(db: sqlite3.Connection, schema: str = "main") -> dict[int, Decimal]:
    sums: dict[int, Decimal] = {}
    for account, amount in db.execute(
        f"SELECT account_id, amount FROM {schema}.accounts_ledgerentry"
    ):
        sums[account] = sums.get(account, Decimal(0)) + Decimal(str(amount))
    return sums


def _manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Migrated:
    """The fixture loaded (``before``), a copy migrated forward (``after``), the environment
    that points ``manage.py`` at the copy, and what ``migrate`` printed."""
    tmp = tmp_path_factory.mktemp("migrate-forward")
    before, after = tmp / "before.sqlite3", tmp / "after.sqlite3"
    with sqlite3.connect(before) as db:
        db.executescript(gzip.decompress(FIXTURE.read_bytes()).decode())
    db.close()
    shutil.copyfile(before, after)
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{after}",
        "LABPORTAL_VAR_DIR": str(tmp / "var"),
    }
    migrate = _manage("migrate", "--noinput", env=env)
    assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]
    return Migrated(before, after, env, migrate.stdout)


@pytest.fixture
def dbs(migrated: Migrated) -> Iterator[sqlite3.Connection]:
    before, after = migrated.before, migrated.after
    db = sqlite3.connect(after)
    db.execute("ATTACH DATABASE ? AS old", (str(before),))
    yield db
    db.close()


def test_the_fixture_is_on_the_old_schema_and_has_data(migrated: Migrated) -> None:
    with sqlite3.connect(migrated.before) as old:
        assert "token" in _columns(old, "reservations_calendarfeed")
        for table in ("accounts_user", "jobqueue_job", "accounts_ledgerentry"):
            assert _count(old, table) > 0, table
        assert _count(old, "reservations_calendarfeed") >= 3
    old.close()
    assert "reservations.0003_calendar_feed_secret" in migrated.output


def test_the_models_and_the_migrations_agree(migrated: Migrated) -> None:
    check = _manage("makemigrations", "--check", "--dry-run", env=migrated.env)
    assert check.returncode == 0, (
        "the models and the migrations disagree:\n" + check.stdout[-3000:] + check.stderr[-3000:]
    )


def test_every_old_table_stays_with_at_least_its_rows(dbs: sqlite3.Connection) -> None:
    old_tables = {
        name
        for (name,) in dbs.execute(
            "SELECT name FROM old.sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    }
    assert len(old_tables) > 50
    missing = old_tables - _tables(dbs)
    assert not missing, f"tables gone after migrating: {sorted(missing)}"
    counts = {table: (_count(dbs, table, "old"), _count(dbs, table)) for table in old_tables}
    fewer = {table: (old, new) for table, (old, new) in counts.items() if new < old}
    assert not fewer, f"tables with fewer rows (before, after): {fewer}"


def test_every_old_row_keeps_its_values(dbs: sqlite3.Connection) -> None:
    """Row by row, over the columns each old table still has: nothing dropped or changed."""
    old_tables = [
        name
        for (name,) in dbs.execute(
            "SELECT name FROM old.sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    ]
    lost_columns: dict[str, set[str]] = {}
    changed: dict[str, int] = {}
    for table in old_tables:
        old_columns = _columns(dbs, table, "old")
        new_columns = set(_columns(dbs, table))
        gone = set(old_columns) - new_columns - DROPPED_COLUMNS.get(table, set())
        if gone:
            lost_columns[table] = gone
        kept = ", ".join(f'"{c}"' for c in old_columns if c in new_columns)
        (differing,) = dbs.execute(
            f'SELECT COUNT(*) FROM (SELECT {kept} FROM old."{table}" '
            f'EXCEPT SELECT {kept} FROM main."{table}")'
        ).fetchone()
        if differing:
            changed[table] = differing
    assert not lost_columns, f"columns gone after migrating: {lost_columns}"
    assert not changed, f"old rows missing or changed (table: rows): {changed}"


def test_spot_checks(dbs: sqlite3.Connection) -> None:
    def rows(sql: str) -> list[tuple[object, ...]]:
        return dbs.execute(sql).fetchall()

    users = "SELECT id, username, email FROM {}accounts_user ORDER BY id"
    assert rows(users.format("")) == rows(users.format("old."))
    assert {"admin", "alice", "bob", "charlie"} <= {u for (_i, u, _e) in rows(users.format(""))}

    jobs = "SELECT id, state, owner_id FROM {}jobqueue_job ORDER BY id"
    assert rows(jobs.format("")) == rows(jobs.format("old."))

    old_sums = _ledger_sums(dbs, "old")
    assert old_sums and _ledger_sums(dbs) == old_sums

    balances = "SELECT id, user_id, balance FROM {}accounts_creditaccount ORDER BY id"
    assert rows(balances.format("")) == rows(balances.format("old."))


def test_calendar_feeds_get_fresh_secrets(dbs: sqlite3.Connection) -> None:
    old = dict(dbs.execute("SELECT id, token FROM old.reservations_calendarfeed").fetchall())
    old_users = dict(dbs.execute("SELECT id, user_id FROM old.reservations_calendarfeed"))
    new = {
        pk: (user, secret)
        for pk, user, secret in dbs.execute(
            "SELECT id, user_id, secret FROM reservations_calendarfeed"
        )
    }
    assert old and set(new) == set(old)
    for pk, token in old.items():
        user, secret = new[pk]
        assert user == old_users[pk]
        assert secret and len(secret) >= 32
        assert secret != token
    assert len({secret for _user, secret in new.values()}) == len(new)
    assert "token" not in _columns(dbs, "reservations_calendarfeed")

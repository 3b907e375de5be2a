"""How the reports read large numbers from the database: datetimes as seconds since 1970
in SQL, a query's rows as one float array (packed by PostgreSQL), and no JIT for a
report's own transaction."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from django.db import connection, transaction
from django.db.models import FloatField, Func


class EpochSeconds(Func):
    """Seconds since 1970 of a datetime expression, as a float, on PostgreSQL and SQLite."""

    output_field = FloatField()

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        # EXTRACT gives a numeric since PostgreSQL 14 (and a cast of it costs as much);
        # date_part computes the same float8 directly, three times faster over a year's jobs.
        return self.as_sql(compiler, connection, template="date_part('epoch', %(expressions)s)")

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(
            compiler, connection, template="((julianday(%(expressions)s) - 2440587.5) * 86400.0)"
        )


def fetch_floats(sql: str, params: Any, columns: int) -> np.ndarray:
    """The rows of `sql` (every column a number or NULL) as a float array, NULL as NaN.

    On PostgreSQL the database packs every row's values as big-endian float8 (float8send)
    into one bytea, which numpy reads as it is: a fetch would make a Python tuple and a
    float per value (the largest cost of a year's report went there)."""
    if connection.vendor != "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        return np.array(rows, dtype=float).reshape(len(rows), columns)  # None becomes NaN
    names = ", ".join(f"c{i}" for i in range(columns))
    packed = " || ".join(f"float8send(COALESCE(c{i}::float8, 'NaN'))" for i in range(columns))
    statement = f"SELECT string_agg({packed}, ''::bytea) FROM ({sql}) AS t ({names})"
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        row = cursor.fetchone()
    data = bytes(row[0]) if row and row[0] is not None else b""
    return np.frombuffer(data, dtype=">f8").astype(float).reshape(-1, columns)


@contextmanager
def without_jit() -> Iterator[None]:
    """PostgreSQL's JIT compiles a report's wide aggregates for longer than they run (2 s of
    compiling for a year's GROUP BY); the report turns it off for its own transaction."""
    if connection.vendor != "postgresql":
        yield
        return
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off")
        yield

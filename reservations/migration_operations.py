"""Migration operations that only act on PostgreSQL."""

from __future__ import annotations

from typing import Any

from django.db.migrations.operations import AddConstraint


class AddConstraintOnPostgres(AddConstraint):
    """AddConstraint that creates the constraint on PostgreSQL only.

    The model state still carries the constraint, so `makemigrations --check` stays
    clean; on SQLite (the demo) the service checks overlaps inside its transaction.
    """

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)

    def describe(self) -> str:
        return super().describe() + " (PostgreSQL only)"

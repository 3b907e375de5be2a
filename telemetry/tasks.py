"""Periodic telemetry work on the control queue: rollups and retention (see telemetry/beat.py)."""

from __future__ import annotations

from celery import shared_task

from telemetry.rollups import rollups_run, telemetry_prune


@shared_task(name="control.telemetry_rollup", time_limit=300, soft_time_limit=240)
def telemetry_rollup() -> str:
    # A run that stops at its time budget leaves the cursors where it got to; the next
    # beat tick carries on, so a long catch-up never holds the worker for long.
    result = rollups_run(budget_s=120)
    return (
        f"minutes {result.minute_buckets}, hours {result.hour_buckets}, "
        f"{'caught up' if result.caught_up else 'catching up'}"
    )


@shared_task(name="control.telemetry_prune", time_limit=300, soft_time_limit=240)
def telemetry_prune_task() -> str:
    result = telemetry_prune()
    return f"pruned raw {result.raw}, minutes {result.minutes}, hours {result.hours}"

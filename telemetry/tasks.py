"""Telemetry work on the control queue: the agents' samples, and periodic rollups and
retention (see telemetry/beat.py)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from cluster.tasks import report_accept
from telemetry.rollups import rollups_run, telemetry_prune
from telemetry.services import samples_ingest as ingest


@shared_task(name="control.telemetry_rollup", time_limit=300, soft_time_limit=240)
def telemetry_rollup() -> str:
    # A run that stops at its time budget leaves the cursors where it got to; the next
    # beat tick carries on, so a long catch-up never holds the worker for long.
    result = rollups_run(budget_s=120)
    return (
        f"minutes {result.minute_buckets}, hours {result.hour_buckets}, "
        f"{'caught up' if result.caught_up else 'catching up'}"
    )


# A run deletes at most its batches (short transactions, so the tables never lock); when it
# stops with rows left it queues the next run straight away instead of waiting for the
# hourly beat, so a large lab (or a lowered retention) catches up at the database's pace.
PRUNE_CATCH_UP_RUNS = 100


@shared_task(name="control.telemetry_prune", time_limit=300, soft_time_limit=240)
def telemetry_prune_task(catch_up_left: int = PRUNE_CATCH_UP_RUNS) -> str:
    result = telemetry_prune()
    if not result.done and catch_up_left > 0:
        telemetry_prune_task.apply_async(kwargs={"catch_up_left": catch_up_left - 1}, countdown=1)
    return (
        f"pruned raw {result.raw}, minutes {result.minutes}, hours {result.hours}"
        f"{'' if result.done else ', more to prune'}"
    )


@shared_task(
    name="control.samples_ingest",
    bind=True,
    max_retries=None,  # retried until LABPORTAL_REPORT_RETRY_S (see report_accept)
    time_limit=120,
    soft_time_limit=100,
)
def samples_ingest(self: Any, node_name: str, token: str, samples: list[dict[str, Any]]) -> str:
    return report_accept(
        self,
        "samples_ingest",
        node_name,
        token,
        lambda name: ingest(node_name=name, samples=samples),
        [samples],
    )

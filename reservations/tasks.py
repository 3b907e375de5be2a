"""Celery tasks of the reservations: the boundary tick, run by beat (see reservations/beat.py)."""

from __future__ import annotations

from celery import shared_task


@shared_task(
    name="control.reservations_tick", soft_time_limit=50, time_limit=60, ignore_result=True
)
def reservations_tick() -> dict[str, int]:
    """Starts, warns, ends and checks for no-shows; every step claims its rows, so twice is safe."""
    from reservations.services import reservations_tick as tick

    return tick()

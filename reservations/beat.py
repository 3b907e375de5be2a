"""Beat entries for the reservations; collected into CELERY_BEAT_SCHEDULE by the settings."""

from __future__ import annotations

from datetime import timedelta

# Slots start and end on a 30-minute grid by default; a 30-second tick switches
# them within half a minute of the boundary.
BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    "reservations-tick": {"task": "control.reservations_tick", "schedule": timedelta(seconds=30)},
}

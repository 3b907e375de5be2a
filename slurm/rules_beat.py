"""Beat entries of the lab's rules in Slurm mode, merged into the schedule by settings."""

from __future__ import annotations

from datetime import timedelta

# Credits from accounting every charging window (the credit policy's default: 5 minutes);
# the rules every minute, so a grant's lapse or a member's zero balance shows within one;
# bookings every minute too (a booking's change is also pushed at once, see signals).
SLURM_RULES_BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    "slurm-accounting-sync": {
        "task": "control.slurm_accounting_sync",
        "schedule": timedelta(minutes=5),
    },
    "slurm-policy-sync": {"task": "control.slurm_policy_sync", "schedule": timedelta(minutes=1)},
    "slurm-reservations-sync": {
        "task": "control.slurm_reservations_sync",
        "schedule": timedelta(minutes=1),
    },
}

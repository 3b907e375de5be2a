"""The demo's twelve weeks of history: figures that agree, and a quiet first minute."""

from __future__ import annotations

import datetime as dt
import io
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from accounts.models import CreditAccount, LedgerEntry, Notification, User
from cluster.models import Gpu
from credits.services import credits_charge_running_jobs, credits_settle_ended_jobs
from jobqueue.models import Allocation
from reports.periods import Period
from reports.selectors import usage_report
from reservations.services import reservations_tick
from telemetry.models import GpuHourRollup
from telemetry.rollups import rollups_run
from telemetry.selectors import lab_daily

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo(settings: Any, tmp_path: Path) -> dt.datetime:
    settings.VAR_DIR = tmp_path
    call_command("seed_demo")
    call_command("seed_demo_history", stdout=io.StringIO())
    return timezone.now()


def test_the_history_is_neither_charged_nor_announced_in_the_demos_first_minutes(
    demo: dt.datetime,
) -> None:
    balances = dict(CreditAccount.objects.values_list("user__username", "balance"))
    entries, notices = LedgerEntry.objects.count(), Notification.objects.count()
    # What the control worker's beat does in the first minutes of `make demo`.
    for minute in range(3):
        now = demo + dt.timedelta(minutes=minute + 1)
        credits_settle_ended_jobs(now=now)
        credits_charge_running_jobs(now=now)
        reservations_tick(now=now)
        rollups_run(now=now)

    assert dict(CreditAccount.objects.values_list("user__username", "balance")) == balances
    assert LedgerEntry.objects.count() == entries
    assert Notification.objects.count() == notices
    assert not Notification.objects.filter(kind__in=["reservation_no_show", "job_idle"]).exists()


def test_the_history_has_telemetry_for_its_held_hours_as_the_rollups_count_them(
    demo: dt.datetime,
) -> None:
    rollups_run(now=demo)  # as the control worker's beat does at once
    staff = User.objects.get(username="admin")
    start = demo - dt.timedelta(weeks=12, hours=1)
    report = usage_report(period=Period("custom", start, demo), viewer=staff, now=demo)
    totals = report.totals

    assert totals.gpu_hours > 1000
    # Held minutes are minutes held: all but the agent's outage and the minutes of a second
    # job in an hour another job held for longer have readings.
    coverage = totals.measured_gpu_hours / totals.gpu_hours
    assert 0.9 < coverage < 1.0
    assert totals.mean_util_pct is not None and 35 < totals.mean_util_pct < 98
    assert totals.used_gpu_hours > 0.3 * totals.gpu_hours


def test_the_lab_overviews_allocated_share_matches_the_gpu_hours_jobs_held(
    demo: dt.datetime,
) -> None:
    gpus = Gpu.objects.filter(kind=Gpu.Kind.WHOLE).count()
    held: dict[dt.date, float] = defaultdict(float)
    for allocated_at, released_at in Allocation.objects.values_list("allocated_at", "released_at"):
        assert released_at is not None  # every history job has ended
        t = allocated_at
        while t < released_at:
            day_end = dt.datetime.combine(t.date() + dt.timedelta(days=1), dt.time.min, dt.UTC)
            upto = min(day_end, released_at)
            held[t.date()] += (upto - t).total_seconds() / 3600
            t = upto
    covered: dict[dt.date, int] = defaultdict(int)
    for bucket in GpuHourRollup.objects.values_list("bucket", flat=True):
        covered[bucket.date()] += 1
    today = demo.date()
    compared = 0
    for day in lab_daily(start=today - dt.timedelta(days=60), end=today):
        if day.allocated_share is None:
            continue
        # The share is of the GPU-hours with readings: the outage's hours are in neither.
        assert day.allocated_share == pytest.approx(day.gpu_hours / covered[day.day], abs=0.001)
        if covered[day.day] == gpus * 24:
            assert day.gpu_hours == pytest.approx(held[day.day], abs=0.05)
            compared += 1
        else:
            # Part of the day has no readings: only the covered hours count, never more
            # than the jobs held (equal where no job ran during the outage's hours).
            assert day.gpu_hours <= held[day.day] + 0.05
    assert compared > 50

"""'GPU-hours really used' read from the hourly rollups, then minute rollups, then raw samples."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from cluster.models import Gpu
from reports.selectors import usage_report
from reports.utilisation import telemetry_windows
from telemetry.models import GpuHourRollup, GpuMinuteRollup, GpuSample, RollupCursor
from tests.reports.conftest import NOW, at

pytestmark = pytest.mark.django_db


def line(report: Any, table: str, name: str) -> Any:
    return next(x for x in report.tables[table] if x.name == name)


@pytest.fixture
def rolled_up(week: dict[str, Any]) -> dict[str, Any]:
    """Hour rollups up to Mon 06:00, minute rollups to 06:10, raw samples after that.

    J1 (alice, 2 A100s, 02:00-12:00): hours 02-05 at 80% (8 GPU-h, 6.4 used); minutes
    06:00-06:09 at 30% (1/3 GPU-h, 0.1 used); one raw sample at 07:00 of 30%, which
    weighs J1's 11 2/3 GPU-h from 06:10 to 12:00 (3.5 used). Alice: 10 of 20 measured.
    J2 (bob, L40S, 01:00-05:00): hours 01-04 at 100% (4 used of 4). The raw samples of
    the conftest before 06:10 are not read: the rollups cover that time.
    """
    j1, j2 = week["jobs"][0], week["jobs"][1]
    a100s = list(Gpu.objects.filter(model="A100").order_by("index"))
    l40s = Gpu.objects.get(uuid="GPU-l0")

    def held_hour(gpu: Gpu, hour: int, util: float, job: Any) -> GpuHourRollup:
        return GpuHourRollup(
            gpu=gpu,
            bucket=at(0, hour),
            samples=720,
            util_mean=util,
            job=job,
            user=job.owner,
            minutes=60,
            busy_minutes=60,
            held_minutes=60,
        )

    hours = [held_hour(gpu, h, 80, j1) for gpu in a100s for h in range(2, 6)]
    hours += [held_hour(l40s, h, 100, j2) for h in range(1, 5)]
    # An idle GPU-hour with no job, and one without a reading: neither counts.
    hours.append(
        GpuHourRollup(
            gpu=l40s,
            bucket=at(0, 0),
            samples=720,
            util_mean=0,
            minutes=60,
            busy_minutes=0,
            held_minutes=0,
        )
    )
    GpuHourRollup.objects.bulk_create(hours)
    GpuMinuteRollup.objects.bulk_create(
        GpuMinuteRollup(
            gpu=gpu,
            bucket=at(0, 6) + dt.timedelta(minutes=m),
            samples=12,
            util_mean=30,
            job=j1,
            user=j1.owner,
        )
        for gpu in a100s
        for m in range(10)
    )
    GpuSample.objects.create(gpu=a100s[0], ts=at(0, 7), util_pct=30, job_id=j1.pk)
    RollupCursor.objects.create(level="hour", done_until=at(0, 6))
    RollupCursor.objects.create(level="minute", done_until=at(0, 6) + dt.timedelta(minutes=10))
    return week


def test_the_period_is_read_from_hour_rollups_then_minutes_then_raw_samples(
    rolled_up: Any,
) -> None:
    period = rolled_up["period"]
    windows = telemetry_windows(start=period.start, end=NOW)
    six = at(0, 6)
    assert windows.hours == (period.start, six)
    assert windows.minutes == (six, six + dt.timedelta(minutes=10))
    assert windows.raw == (six + dt.timedelta(minutes=10), NOW)


def test_a_period_the_rollups_cover_reads_no_raw_samples(rolled_up: Any) -> None:
    RollupCursor.objects.update(done_until=NOW + dt.timedelta(days=1))
    period = rolled_up["period"]
    windows = telemetry_windows(start=period.start, end=NOW)
    assert windows.hours == (period.start, NOW)
    assert windows.minutes is None and windows.raw is None


def test_used_gpu_hours_add_up_across_the_three_sources(rolled_up: Any, admin_user: Any) -> None:
    report = usage_report(period=rolled_up["period"], viewer=admin_user, now=NOW)
    alice, bob = line(report, "user", "alice"), line(report, "user", "bob")
    assert (alice.gpu_hours, alice.used_gpu_hours, alice.measured_gpu_hours) == pytest.approx(
        (28, 6.4 + 0.1 + 3.5, 8 + 1 / 3 + 35 / 3)
    )
    assert alice.mean_util_pct == pytest.approx(50)
    assert (bob.used_gpu_hours, bob.mean_util_pct) == pytest.approx((4, 100))
    assert report.totals.used_gpu_hours == pytest.approx(14)
    assert line(report, "model", "A100").used_gpu_hours == pytest.approx(10)
    assert line(report, "queue", "normal").used_gpu_hours == pytest.approx(14)
    (week_line,) = report.weeks
    assert week_line.used_gpu_hours == pytest.approx(14)


def test_without_rollups_every_figure_comes_from_raw_samples(week: Any, admin_user: Any) -> None:
    assert not RollupCursor.objects.exists()
    report = usage_report(period=week["period"], viewer=admin_user, now=NOW)
    # J1's two samples per GPU (40%, 60%) weigh its 20 GPU-h; J2's one sample its 4.
    assert line(report, "user", "alice").used_gpu_hours == pytest.approx(10)
    assert report.totals.used_gpu_hours == pytest.approx(14)

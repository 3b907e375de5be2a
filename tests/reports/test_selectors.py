"""Every figure of the usage report against the hand-built week in conftest.py."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from reports.periods import period_of
from reports.selectors import usage_report
from tests.factories import GpuFactory, NodeFactory
from tests.reports.conftest import MONDAY, NOW, at, make_job

pytestmark = pytest.mark.django_db


def line(report: Any, table: str, name: str) -> Any:
    return next(x for x in report.tables[table] if x.name == name)


def test_lab_totals_add_up_allocated_used_and_final_states(week: Any, admin_user: Any) -> None:
    report = usage_report(period=week["period"], viewer=admin_user, now=NOW)
    totals = report.totals
    assert report.capacity_gpus == 4
    assert totals.gpu_hours == pytest.approx(20 + 4 + 4 + 8)
    # J1: 20 GPU-h at 50%, J2: 4 at 100%; J3 and J4 have no telemetry.
    assert totals.used_gpu_hours == pytest.approx(14)
    assert totals.mean_util_pct == pytest.approx(100 * 14 / 24)
    assert dict(totals.jobs) == {"completed": 3, "failed": 1}
    assert totals.credits == pytest.approx(20 - 2 + 4 + 6)


def test_per_user_lines_split_hours_credits_and_utilisation(week: Any, admin_user: Any) -> None:
    report = usage_report(period=week["period"], viewer=admin_user, now=NOW)
    alice, bob, charlie = (line(report, "user", n) for n in ("alice", "bob", "charlie"))
    assert (alice.gpu_hours, alice.used_gpu_hours, alice.mean_util_pct) == pytest.approx(
        (28, 10, 50)
    )
    assert (bob.gpu_hours, bob.used_gpu_hours, bob.mean_util_pct) == pytest.approx((4, 4, 100))
    assert charlie.gpu_hours == pytest.approx(4) and charlie.mean_util_pct is None
    assert (alice.credits, bob.credits, charlie.credits) == pytest.approx((24, 4, 0))
    assert [x.name for x in report.tables["user"]] == ["alice", "bob", "charlie"]


def test_category_queue_node_and_model_lines(week: Any, admin_user: Any) -> None:
    report = usage_report(period=week["period"], viewer=admin_user, now=NOW)
    assert line(report, "category", "PhD, thesis phase").gpu_hours == pytest.approx(32)
    assert line(report, "category", "Master").gpu_hours == pytest.approx(4)
    normal = line(report, "queue", "normal")
    assert normal.gpu_hours == pytest.approx(32) and normal.credits == pytest.approx(22)
    assert dict(line(report, "queue", "debug").jobs) == {"completed": 1}
    # J4 ran on both nodes; a job counts on the node it was dispatched to.
    assert line(report, "node", "gpu01").gpu_hours == pytest.approx(28)
    assert line(report, "node", "gpu02").gpu_hours == pytest.approx(8)
    # A job's GPU model is the model of its first allocated GPU.
    assert line(report, "model", "A100").gpu_hours == pytest.approx(28)
    assert line(report, "model", "L40S").used_gpu_hours == pytest.approx(4)


def test_waits_per_queue_give_mean_median_and_p95(week: Any, admin_user: Any) -> None:
    report = usage_report(period=week["period"], viewer=admin_user, now=NOW)
    waits = {w.queue: w for w in report.waits}
    assert waits["normal"].jobs == 3
    assert waits["normal"].mean_h == pytest.approx((2 + 0 + 9) / 3)
    assert waits["normal"].p50_h == pytest.approx(2)
    assert waits["normal"].p95_h == pytest.approx(2 + (9 - 2) * 0.9)
    assert (waits["debug"].p50_h, waits["debug"].p95_h) == pytest.approx((6, 6))


def test_unmet_demand_counts_only_waits_while_too_few_gpus_were_free(
    week: Any, admin_user: Any
) -> None:
    report = usage_report(period=week["period"], viewer=admin_user, now=NOW)
    # J4 (4 GPUs) waited 03:00-05:00 with 1 free and 05:00-12:00 with 2 free: 4*2 + 4*7.
    # J1 and J3 waited while enough GPUs were free, so they add nothing.
    assert report.unmet_gpu_hours == pytest.approx(36)
    (week_line,) = report.weeks
    assert week_line.capacity_gpu_hours == pytest.approx(4 * 168)
    assert week_line.allocation_pct == pytest.approx(100 * 36 / 672)
    # Real utilisation is measured over the covered GPU-hours only (J1's 20, J2's 4).
    assert week_line.mean_util_pct == pytest.approx(100 * 14 / 24)


def test_the_report_states_its_telemetry_coverage_and_never_counts_missing_samples_as_idle(
    week: Any, admin_user: Any
) -> None:
    report = usage_report(period=week["period"], viewer=admin_user, now=NOW)
    # Allocated 36 GPU-hours; J3 (4) and J4 (8) sent no samples: 24 covered.
    assert report.totals.coverage_pct == pytest.approx(100 * 24 / 36)
    assert report.totals.mean_util_pct == pytest.approx(100 * 14 / 24)
    alice = line(report, "user", "alice")
    assert alice.coverage_pct == pytest.approx(100 * 20 / 28)  # J1 covered, J4 not
    assert alice.mean_util_pct == pytest.approx(50)
    charlie = line(report, "user", "charlie")  # J3 only: no samples at all
    assert (charlie.coverage_pct, charlie.mean_util_pct, charlie.used_gpu_hours) == (0, None, 0)
    (week_line,) = report.weeks
    assert week_line.as_dict()["coverage_pct"] == pytest.approx(66.7)
    assert "utilisation_pct" not in week_line.as_dict()  # no share of capacity counted idle


def test_bookings_split_booked_hours_into_used_released_and_no_shows(
    week: Any, admin_user: Any
) -> None:
    report = usage_report(period=week["period"], viewer=admin_user, now=NOW)
    by_user = {b.user: b for b in report.bookings}
    assert set(by_user) == {"alice", "bob"}
    alice, bob = by_user["alice"], by_user["bob"]
    assert (alice.booked_h, alice.released_h, alice.no_show_h, alice.used_h) == pytest.approx(
        (8, 4, 0, 4)
    )
    assert (bob.booked_h, bob.no_show_h, bob.used_h) == pytest.approx((2, 2, 0))
    total = report.bookings_total
    assert (total.bookings, total.booked_h, total.used_h) == pytest.approx((2, 10, 4))


def test_a_member_sees_lab_totals_and_only_their_own_line(week: Any, bob: Any) -> None:
    report = usage_report(period=week["period"], viewer=bob, now=NOW)
    assert report.totals.gpu_hours == pytest.approx(36)
    assert [x.name for x in report.tables["user"]] == ["bob"]
    assert "category" not in report.tables
    assert [b.user for b in report.bookings] == ["bob"]
    assert report.bookings_total.booked_h == pytest.approx(10)


def test_a_running_job_counts_up_to_now_and_a_job_outside_counts_nothing(
    week: Any, admin_user: Any
) -> None:
    job = week["jobs"][2]
    job.ended_at = None
    job.state = "running"
    job.save()
    mid = week["period"].start.replace(day=3, hour=8)  # Tue 08:00: two hours into J3's run
    report = usage_report(period=week["period"], viewer=admin_user, now=mid)
    assert line(report, "user", "charlie").gpu_hours == pytest.approx(2)
    assert line(report, "user", "bob").gpu_hours == pytest.approx(4)  # not the earlier job


def test_on_a_node_of_two_models_a_job_counts_for_its_first_gpus_model_and_weeks_split_runs(
    queues: Any, alice: Any, admin_user: Any
) -> None:
    node = NodeFactory.create(name="mixed01")
    a100 = GpuFactory.create(node=node, index=0, uuid="GPU-m0", model="A100")
    l40s = GpuFactory.create(node=node, index=1, uuid="GPU-m1", model="L40S")
    make_job(alice, "normal", [l40s], at(0, 0), at(0, 0), at(0, 3), "completed")
    make_job(alice, "normal", [a100, l40s], at(0, 1), at(0, 4), at(0, 6), "failed")
    # Sunday 22:00 to Monday 02:00: two hours in each week.
    make_job(alice, "normal", [a100], at(6, 22), at(6, 22), at(7, 2), "completed")
    period = period_of("custom", MONDAY.date(), MONDAY.date() + dt.timedelta(days=13))
    report = usage_report(period=period, viewer=admin_user, now=at(14, 0))
    a100_line, l40s_line = line(report, "model", "A100"), line(report, "model", "L40S")
    assert a100_line.gpu_hours == pytest.approx(8)
    assert dict(a100_line.jobs) == {"completed": 1, "failed": 1}
    assert l40s_line.gpu_hours == pytest.approx(3) and dict(l40s_line.jobs) == {"completed": 1}
    assert line(report, "node", "mixed01").gpu_hours == pytest.approx(11)
    assert [w.gpu_hours for w in report.weeks] == pytest.approx([9, 2])

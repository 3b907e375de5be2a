"""Rollups and retention, against values computed by hand; run on SQLite and on PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine

from cluster.models import Gpu
from jobqueue.models import Allocation
from telemetry import rollups
from telemetry.models import (
    GpuHourRollup,
    GpuMinuteRollup,
    GpuSample,
    RetentionPolicy,
    RollupCursor,
)
from telemetry.rollups import floor_to, rollups_run, telemetry_prune
from telemetry.selectors import usage_per_gpu, usage_per_job, usage_per_user
from telemetry.tasks import samples_ingest
from tests.cluster.conftest import job_on
from tests.telemetry.test_ingest import a_sample

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def sample(gpu: Gpu, when: datetime, **metrics: Any) -> GpuSample:
    values = {"util_pct": None, "mem_used_mb": None, "temp_c": None, "power_w": None}
    values.update(metrics)
    return GpuSample.objects.create(gpu=gpu, ts=when, **values)


def minute_row(gpu: Gpu, when: datetime) -> GpuMinuteRollup:
    return GpuMinuteRollup.objects.get(gpu=gpu, bucket=when)


def snapshot(model: type[Any]) -> list[tuple[Any, ...]]:
    fields = [f.attname for f in model._meta.concrete_fields if f.name != "id"]
    return sorted(model.objects.values_list(*fields))


@pytest.fixture
def gpus(registered_node: Any) -> tuple[Gpu, Gpu]:
    node, _secret = registered_node
    return Gpu.objects.get(uuid="GPU-aaa"), Gpu.objects.get(uuid="GPU-bbb")


@pytest.fixture
def two_jobs(registered_node: Any, alice: Any, bob: Any) -> tuple[Any, Any]:
    node, _secret = registered_node
    return job_on(node, alice, name="seen"), job_on(node, bob, name="held")


def test_minutes_and_hours_match_values_computed_by_hand(
    gpus: tuple[Gpu, Gpu], two_jobs: tuple[Any, Any], alice: Any, bob: Any
) -> None:
    aaa, bbb = gpus
    seen, held = two_jobs
    # Minute 10:00: two readings, the agent saw job `seen` on the GPU in both.
    sample(aaa, at(0.1), util_pct=10.0, mem_used_mb=100, temp_c=50.0, power_w=100.0, job_id=seen.pk)
    sample(aaa, at(0.6), util_pct=30.0, mem_used_mb=300, temp_c=60.0, power_w=200.0, job_id=seen.pk)
    # Minute 10:01: one reading without utilisation or power, no process seen, but
    # `held` has the GPU allocated from 10:01:30: the minute names it.
    sample(aaa, at(1.2), mem_used_mb=200, temp_c=55.0)
    Allocation.objects.create(job=held, gpu=aaa, allocated_at=at(1.5), active=True)
    # Another GPU in the same minutes, idle, nobody holding it.
    sample(bbb, at(0.5), util_pct=0.0, mem_used_mb=0, temp_c=30.0, power_w=50.0)

    result = rollups_run(now=at(3))

    assert result.caught_up
    first = minute_row(aaa, at(0))
    assert (first.samples, first.util_mean, first.util_max) == (2, 20.0, 30.0)
    assert (first.mem_used_max_mb, first.temp_max_c, first.power_mean_w) == (300, 60.0, 150.0)
    assert (first.job_id, first.user_id) == (seen.pk, alice.pk)
    second = minute_row(aaa, at(1))
    assert (second.samples, second.util_mean, second.util_max, second.power_mean_w) == (
        1,
        None,
        None,
        None,
    )
    assert (second.mem_used_max_mb, second.job_id, second.user_id) == (200, held.pk, bob.pk)
    idle = minute_row(bbb, at(0))
    assert (idle.util_mean, idle.job_id, idle.user_id) == (0.0, None, None)

    hour = GpuHourRollup.objects.get(gpu=aaa, bucket=T0)
    # Utilisation is weighted by the readings that had it: (10 + 30) / 2.
    assert (hour.samples, hour.util_mean, hour.util_max) == (3, 20.0, 30.0)
    assert (hour.mem_used_max_mb, hour.temp_max_c, hour.power_mean_w) == (300, 60.0, 150.0)
    # One minute each: the tie goes to the lower job id.
    assert (hour.minutes, hour.busy_minutes, hour.held_minutes) == (2, 2, 1)
    assert (hour.job_id, hour.user_id) == (seen.pk, alice.pk)
    assert GpuHourRollup.objects.get(gpu=bbb, bucket=T0).busy_minutes == 0


def test_the_job_seen_most_often_in_a_minute_holds_it(
    gpus: tuple[Gpu, Gpu], two_jobs: tuple[Any, Any]
) -> None:
    aaa, _bbb = gpus
    seen, held = two_jobs
    Allocation.objects.create(job=seen, gpu=aaa, allocated_at=at(-10), active=True)
    for second in (5, 15, 25):
        sample(aaa, T0 + timedelta(seconds=second), util_pct=90.0, job_id=held.pk)
    sample(aaa, T0 + timedelta(seconds=35), util_pct=90.0, job_id=seen.pk)

    rollups_run(now=at(2))

    assert minute_row(aaa, T0).job_id == held.pk


def test_running_twice_changes_nothing(gpus: tuple[Gpu, Gpu], two_jobs: tuple[Any, Any]) -> None:
    aaa, bbb = gpus
    for i in range(30):
        sample(aaa, at(i * 0.5), util_pct=float(i), power_w=100.0 + i, job_id=two_jobs[0].pk)
        sample(bbb, at(i * 0.5), util_pct=50.0, temp_c=40.0 + i)

    rollups_run(now=at(20))
    minutes, hours = snapshot(GpuMinuteRollup), snapshot(GpuHourRollup)
    cursors = list(RollupCursor.objects.values_list("level", "done_until"))
    rollups_run(now=at(20))

    assert snapshot(GpuMinuteRollup) == minutes
    assert snapshot(GpuHourRollup) == hours
    assert list(RollupCursor.objects.values_list("level", "done_until")) == cursors
    assert len(minutes) == 2 * 15 and len(hours) == 2


def test_it_catches_up_after_downtime_in_bounded_chunks(gpus: tuple[Gpu, Gpu]) -> None:
    aaa, _bbb = gpus
    sample(aaa, at(0), util_pct=10.0)
    rollups_run(now=at(5))
    # Beat is down for 26 hours while samples keep arriving (one a minute, 30% busy).
    GpuSample.objects.bulk_create(
        [GpuSample(gpu=aaa, ts=at(minute), util_pct=30.0) for minute in range(6, 26 * 60)]
    )

    result = rollups_run(now=at(26 * 60 + 1))

    assert result.caught_up
    assert GpuMinuteRollup.objects.filter(gpu=aaa).count() == 1 + 26 * 60 - 6
    hours = list(GpuHourRollup.objects.filter(gpu=aaa).order_by("bucket"))
    assert len(hours) == 26
    assert hours[0].util_mean == pytest.approx((10 + 54 * 30) / 55)
    assert all(h.util_mean == pytest.approx(30.0) and h.minutes == 60 for h in hours[1:])
    minute_cursor = RollupCursor.objects.get(level="minute").done_until
    assert minute_cursor == at(26 * 60 + 1)


def test_a_run_out_of_time_leaves_the_rest_for_the_next(gpus: tuple[Gpu, Gpu]) -> None:
    aaa, _bbb = gpus
    GpuSample.objects.bulk_create(
        [GpuSample(gpu=aaa, ts=at(minute), util_pct=30.0) for minute in range(0, 5 * 60)]
    )

    first = rollups_run(now=at(5 * 60), budget_s=0)

    assert not first.caught_up
    assert rollups_run(now=at(5 * 60)).caught_up
    assert GpuMinuteRollup.objects.count() == 5 * 60


def test_a_late_batch_moves_the_cursors_back_and_is_rolled_up(
    registered_node: Any, gpus: tuple[Gpu, Gpu]
) -> None:
    _node, secret = registered_node
    aaa, _bbb = gpus
    now = datetime.now(tz=UTC).replace(second=0, microsecond=0)
    with time_machine.travel(now, tick=False):
        assert (
            samples_ingest(
                "gpu01",
                secret,
                [a_sample("GPU-aaa", (now - timedelta(minutes=40)).timestamp(), util_pct=80.0)],
            )
            == "ok"
        )
        rollups_run(now=now)
        assert minute_row(aaa, now - timedelta(minutes=40)).util_mean == 80.0
        late = now - timedelta(minutes=40) + timedelta(seconds=30)
        # An agent that was cut off sends what it buffered, 40 minutes late.
        assert (
            samples_ingest("gpu01", secret, [a_sample("GPU-aaa", late.timestamp(), util_pct=20.0)])
            == "ok"
        )
        assert RollupCursor.objects.get(level="minute").done_until == floor_to(late, rollups.MINUTE)

        rollups_run(now=now)

    assert minute_row(aaa, now - timedelta(minutes=40)).util_mean == 50.0
    hour = GpuHourRollup.objects.get(gpu=aaa, bucket=floor_to(late, rollups.HOUR))
    assert hour.samples == 2


def test_retention_prunes_old_rows_in_bounded_batches(gpus: tuple[Gpu, Gpu]) -> None:
    aaa, _bbb = gpus
    policy = RetentionPolicy.current()
    assert (policy.raw_days, policy.minute_days, policy.hour_days) == (2, 30, None)
    GpuSample.objects.bulk_create(
        [GpuSample(gpu=aaa, ts=at(minute), util_pct=10.0) for minute in range(0, 10)]
    )
    rollups_run(now=at(20))
    later = at(3 * 24 * 60)

    first = telemetry_prune(now=later, batch_size=4, max_batches=1)

    assert (first.raw, first.done) == (4, False)
    assert GpuSample.objects.count() == 6
    telemetry_prune(now=later, batch_size=4)
    assert GpuSample.objects.count() == 0
    # Minutes are kept 30 days, hours for good.
    assert GpuMinuteRollup.objects.count() == 10
    # The cursors have moved on by then (no readings to roll up in between).
    assert rollups_run(now=at(31 * 24 * 60)).caught_up
    telemetry_prune(now=at(31 * 24 * 60))
    assert GpuMinuteRollup.objects.count() == 0
    assert GpuHourRollup.objects.count() == 1
    policy.hour_days = 365
    policy.save()
    telemetry_prune(now=at(366 * 24 * 60))
    assert GpuHourRollup.objects.count() == 0


def test_nothing_is_pruned_before_it_is_rolled_up(gpus: tuple[Gpu, Gpu]) -> None:
    aaa, _bbb = gpus
    sample(aaa, at(0), util_pct=10.0)
    rollups_run(now=at(1))
    sample(aaa, at(10), util_pct=90.0)  # arrives; beat then stops for three days

    telemetry_prune(now=at(3 * 24 * 60))

    assert GpuSample.objects.filter(ts=at(10)).exists()
    rollups_run(now=at(3 * 24 * 60))
    assert minute_row(aaa, at(10)).util_mean == 90.0


def test_usage_selectors_count_held_hours_per_gpu_job_and_user(
    gpus: tuple[Gpu, Gpu], two_jobs: tuple[Any, Any], alice: Any, bob: Any
) -> None:
    aaa, bbb = gpus
    seen, held = two_jobs
    # aaa: `seen` for 90 minutes at 80%; bbb: `held` for 30 minutes at 20%, then idle.
    rows = [GpuSample(gpu=aaa, ts=at(m), util_pct=80.0, job_id=seen.pk) for m in range(90)]
    rows += [GpuSample(gpu=bbb, ts=at(m), util_pct=20.0, job_id=held.pk) for m in range(30)]
    rows += [GpuSample(gpu=bbb, ts=at(m), util_pct=0.0) for m in range(30, 60)]
    GpuSample.objects.bulk_create(rows)
    rollups_run(now=at(120))
    start, end = T0, at(24 * 60)

    users = {u.key: u for u in usage_per_user(start=start, end=end)}
    assert users[alice.pk].gpu_hours == pytest.approx(1.5)
    assert users[alice.pk].util_mean == pytest.approx(80.0)
    assert users[bob.pk].gpu_hours == pytest.approx(0.5)
    assert [j.key for j in usage_per_job(start=start, end=end, job_ids=[held.pk])] == [held.pk]
    per_gpu = {g.key: g for g in usage_per_gpu(start=start, end=end)}
    assert per_gpu[bbb.pk].gpu_hours == pytest.approx(0.5)
    assert per_gpu[bbb.pk].util_mean == pytest.approx(10.0)
    assert per_gpu[bbb.pk].util_max == 20.0


@pytest.mark.postgres
def test_the_sql_path_and_the_portable_path_agree(
    gpus: tuple[Gpu, Gpu], two_jobs: tuple[Any, Any]
) -> None:
    aaa, bbb = gpus
    seen, held = two_jobs
    Allocation.objects.create(job=held, gpu=bbb, allocated_at=at(7.5), active=True)
    rows = []
    for i in range(200):
        rows.append(
            GpuSample(
                gpu=aaa if i % 2 else bbb,
                ts=at(i * 0.37),
                util_pct=None if i % 11 == 0 else (i * 7) % 100,
                mem_used_mb=(i * 131) % 80000,
                temp_c=40 + i % 30,
                power_w=None if i % 13 == 0 else 100.0 + i,
                job_id=seen.pk if i % 3 == 0 else None,
            )
        )
    GpuSample.objects.bulk_create(rows)

    rollups._minutes_sql(T0, at(90))
    rollups._hours_sql(T0, at(90))
    by_sql = snapshot(GpuMinuteRollup), snapshot(GpuHourRollup)
    GpuMinuteRollup.objects.all().delete()
    GpuHourRollup.objects.all().delete()
    rollups._minutes_python(T0, at(90))
    rollups._hours_python(T0, at(90))
    by_python = snapshot(GpuMinuteRollup), snapshot(GpuHourRollup)

    for sql_rows, python_rows in zip(by_sql, by_python, strict=True):
        assert len(sql_rows) == len(python_rows) > 0
        for a, b in zip(sql_rows, python_rows, strict=True):
            for x, y in zip(a, b, strict=True):
                assert x == (pytest.approx(y) if isinstance(y, float) else y)


def test_a_prune_run_that_stops_at_its_budget_queues_the_next_run(
    gpus: tuple[Gpu, Gpu], monkeypatch: pytest.MonkeyPatch
) -> None:
    from telemetry import tasks

    aaa, _bbb = gpus
    GpuSample.objects.bulk_create(
        [GpuSample(gpu=aaa, ts=at(minute), util_pct=10.0) for minute in range(0, 10)]
    )
    rollups_run(now=at(20))
    later = at(3 * 24 * 60)
    monkeypatch.setattr(
        tasks, "telemetry_prune", lambda: telemetry_prune(now=later, batch_size=4, max_batches=1)
    )
    queued: list[dict[str, int]] = []
    monkeypatch.setattr(
        tasks.telemetry_prune_task,
        "apply_async",
        lambda kwargs, countdown: queued.append(kwargs),
    )

    assert tasks.telemetry_prune_task.run(catch_up_left=5).endswith("more to prune")
    assert queued == [{"catch_up_left": 4}] and GpuSample.objects.count() == 6
    # Run the queued runs as the worker would: they stop once nothing is left, and a
    # chain that runs out of runs stops too (the hourly beat carries on from there).
    while queued:
        tasks.telemetry_prune_task.run(**queued.pop())
    assert GpuSample.objects.count() == 0
    assert tasks.telemetry_prune_task.run(catch_up_left=0) == "pruned raw 0, minutes 0, hours 0"

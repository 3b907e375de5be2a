from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from reservations.selectors import (
    busy_fraction_by_hour_of_week,
    calendar_view,
    hour_of_week,
    reservation_rows_for_scheduler,
)
from reservations.services import reservation_cancel, reservation_create
from tests.reservations.conftest import T0, at
from tests.reservations.factories import finished_job, running_job

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _setup(contracts: Any, clock: Any) -> None:
    pass


class TestReservationsForScheduler:
    def test_it_returns_live_bookings_overlapping_the_horizon_with_gpus(
        self, alice: Any, bob: Any, gpus: list[Any]
    ) -> None:
        inside = reservation_create(user=alice, gpu_ids=[gpus[0].pk], start=at(1), end=at(2))
        running = reservation_create(
            user=bob, gpu_ids=[gpus[1].pk, gpus[2].pk], start=at(0), end=at(3)
        )
        reservation_create(user=alice, gpu_ids=[gpus[3].pk], start=at(30), end=at(31))  # beyond
        cancelled = reservation_create(user=bob, gpu_ids=[gpus[4].pk], start=at(1), end=at(2))
        reservation_cancel(reservation_id=cancelled.pk, actor=bob)
        with CaptureQueriesContext(connection) as queries:
            found = reservation_rows_for_scheduler(now=T0, horizon=timedelta(hours=24))
        assert len(queries) == 2
        assert found == [
            (running.pk, bob.username, (gpus[1].uuid, gpus[2].uuid), at(0), at(3)),
            (inside.pk, alice.username, (gpus[0].uuid,), at(1), at(2)),
        ]

    def test_a_booking_that_has_ended_is_not_returned(
        self, alice: Any, gpus: list[Any], clock: Any
    ) -> None:
        reservation_create(user=alice, gpu_ids=[gpus[0].pk], start=at(1), end=at(2))
        assert reservation_rows_for_scheduler(now=at(2), horizon=timedelta(hours=24)) == []
        assert len(reservation_rows_for_scheduler(now=at(1.5), horizon=timedelta(hours=1))) == 1


class TestBusyHours:
    def test_busy_fraction_comes_from_past_allocations(self, alice: Any, gpus: list[Any]) -> None:
        # Last Monday 10:00-12:00 on 4 of the 8 GPUs: half the lab busy in those hours, one week of 4.
        finished_job(
            owner=alice,
            gpus=gpus[:4],
            started_at=T0 - timedelta(days=7) + timedelta(hours=1),
            hours=2,
        )
        busy = busy_fraction_by_hour_of_week(now=T0, weeks=4)
        monday_10 = hour_of_week(T0 + timedelta(hours=1))
        assert busy[monday_10] == pytest.approx(0.5 / 4)
        assert busy[monday_10 + 1] == pytest.approx(0.5 / 4)
        assert busy[monday_10 + 2] == 0
        assert len(busy) == 168


class TestCalendar:
    def test_it_groups_gpus_by_node_and_marks_own_other_maintenance_and_jobs(
        self, alice: Any, bob: Any, admin_user: Any, gpus: list[Any]
    ) -> None:
        reservation_create(user=alice, gpu_ids=[gpus[0].pk], start=at(1), end=at(2))
        reservation_create(user=bob, gpu_ids=[gpus[1].pk], start=at(1), end=at(2))
        reservation_create(
            user=admin_user, gpu_ids=[gpus[4].pk], start=at(1), end=at(2), maintenance=True
        )
        running_job(owner=bob, gpus=[gpus[2]], time_limit_s=2 * 3600)
        view = calendar_view(user=alice, start=T0 - timedelta(hours=9), days=1, now=T0)
        assert [g.node.name for g in view["groups"]] == ["gpu01", "gpu02"]
        rows = {row.gpu.pk: row for group in view["groups"] for row in group.rows}
        assert [b.kind for b in rows[gpus[0].pk].bars] == ["mine"]
        assert [(b.kind, b.title) for b in rows[gpus[1].pk].bars] == [
            ("other", "bob")
        ]  # whose it is, as the queue shows owners
        assert [b.kind for b in rows[gpus[4].pk].bars] == ["maintenance"]
        job_bar = rows[gpus[2].pk].bars[0]
        assert job_bar.kind == "job"
        assert job_bar.left_pct + job_bar.width_pct == pytest.approx((11 / 24) * 100, abs=0.01)
        assert len(view["columns"]) == 24


def _busy_by_hour_reference(
    intervals: list[tuple[Any, Any]], since: Any, now: Any
) -> dict[int, float]:
    """The definition, hour by hour: each interval's overlap with every local hour it touches."""
    from django.utils import timezone

    from reservations.timegrid import overlap

    totals: dict[int, float] = {}
    for begin, end in intervals:
        begin, end = max(begin, since), min(end, now)
        hour = timezone.localtime(begin).replace(minute=0, second=0, microsecond=0)
        while hour < end:
            nxt = hour + timedelta(hours=1)
            h = hour_of_week(hour)
            totals[h] = totals.get(h, 0.0) + overlap(begin, end, hour, nxt).total_seconds()
            hour = nxt
    return totals


class TestBusyHoursSweep:
    def test_the_sweep_equals_the_hour_by_hour_definition(self, db: Any) -> None:
        import random

        from reservations.selectors import _busy_seconds_by_hour_of_week

        rng = random.Random(3)
        since, now = T0 - timedelta(weeks=4), T0
        intervals = []
        for _ in range(300):
            begin = since - timedelta(hours=5) + timedelta(seconds=rng.uniform(0, 29 * 86400))
            intervals.append((begin, begin + timedelta(seconds=rng.uniform(1, 30 * 3600))))
        swept = _busy_seconds_by_hour_of_week(
            ((max(b, since).timestamp(), min(e, now).timestamp()) for b, e in intervals),
            since=since,
            now=now,
        )
        expected = _busy_by_hour_reference(intervals, since, now)
        assert set(k for k, v in swept.items() if v) == set(k for k, v in expected.items() if v)
        for h, seconds in expected.items():
            assert swept[h] == pytest.approx(seconds, abs=1e-3)

    def test_while_one_request_computes_the_profile_others_show_the_last_one(
        self, alice: Any, gpus: list[Any], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from django.core.cache import cache

        before = busy_fraction_by_hour_of_week(now=T0, weeks=4)
        finished_job(owner=alice, gpus=gpus[:2], started_at=T0 - timedelta(days=2), hours=1)
        with monkeypatch.context() as m:  # another request is computing the new profile
            m.setattr(cache, "add", lambda *args, **kwargs: False)
            assert busy_fraction_by_hour_of_week(now=T0, weeks=4) == before
        after = busy_fraction_by_hour_of_week(now=T0, weeks=4)
        assert sum(after.values()) > sum(before.values()) == 0

    def test_a_job_that_ends_shows_in_the_profile_at_once(
        self, alice: Any, gpus: list[Any]
    ) -> None:
        before = busy_fraction_by_hour_of_week(now=T0, weeks=4)
        finished_job(owner=alice, gpus=gpus[:2], started_at=T0 - timedelta(days=2), hours=1)
        after = busy_fraction_by_hour_of_week(now=T0, weeks=4)
        assert sum(after.values()) > sum(before.values()) == 0

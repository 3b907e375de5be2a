"""Start estimates ahead of now are shown as a range: far ones scaled by the lead, near
ones (within the hour) as the estimate plus a fixed time."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.urls import reverse
from django.utils import timezone, translation

from jobqueue.models import Job
from jobqueue.templatetags.queue_rows import estimated_start_text
from scheduler.predict import (
    RANGE_EARLY,
    RANGE_FROM_S,
    RANGE_LATE,
    RANGE_NEAR_LATE_S,
    start_estimate_range,
)
from tests.jobqueue.test_submit import submit

pytestmark = pytest.mark.django_db


def test_an_estimate_within_the_hour_is_a_range_reaching_a_fixed_time_past_it() -> None:
    # Near estimates come true late by about as many seconds whatever their lead.
    earliest, latest = start_estimate_range(1000.0, 1000.0 + 600.0) or (0.0, 0.0)
    assert earliest == pytest.approx(1000.0 + RANGE_EARLY * 600.0)
    assert latest == pytest.approx(1000.0 + 600.0 + RANGE_NEAR_LATE_S)


def test_near_and_far_ranges_meet_at_an_hour_on_the_early_side() -> None:
    below = start_estimate_range(0.0, RANGE_FROM_S - 1)
    above = start_estimate_range(0.0, RANGE_FROM_S)
    assert below is not None and above is not None
    assert above[0] - below[0] == pytest.approx(RANGE_EARLY)


def test_an_estimate_not_ahead_of_now_is_one_time() -> None:
    assert start_estimate_range(1000.0, 1000.0) is None
    assert start_estimate_range(1000.0, 900.0) is None


def test_a_far_estimate_becomes_a_range_around_it_scaled_by_the_lead() -> None:
    earliest, latest = start_estimate_range(0.0, 10 * 3600.0) or (0.0, 0.0)
    assert earliest == pytest.approx(RANGE_EARLY * 10 * 3600.0)
    assert latest == pytest.approx(RANGE_LATE * 10 * 3600.0)
    assert earliest < 10 * 3600.0 < latest


def _waiting(owner: Any, ahead: timedelta) -> Job:
    job = submit(owner)
    job.estimated_start = timezone.now() + ahead
    job.pending_reason = "resources"
    job.queue_position = 3
    job.save(update_fields=["estimated_start", "pending_reason", "queue_position"])
    return job


@time_machine.travel("2026-03-02 09:00:00+00:00", tick=False)
def test_the_job_page_shows_a_range_for_near_and_far_estimates_but_not_stale_ones(
    alice: Any, cluster: Any, image: Any, client: Any
) -> None:
    near = _waiting(alice, timedelta(minutes=20))
    far = _waiting(alice, timedelta(hours=20))
    stale = _waiting(alice, timedelta(minutes=-5))
    client.force_login(alice)
    # Within today: times only (a quarter of the 20 min lead after now, 75 min past the estimate).
    page = client.get(reverse("job_detail", args=[near.pk])).content.decode()
    assert "likely today between 09:05 and 10:35" in page
    assert 'data-testid="estimated-start-range"' in page
    # Reaching into another day: dates too.
    page = client.get(reverse("job_detail", args=[far.pk])).content.decode()
    assert "likely between 2026-03-02 14:00 and 2026-03-06 13:00" in page
    assert 'data-testid="estimated-start-range"' in page
    page = client.get(reverse("job_detail", args=[stale.pk])).content.decode()
    assert "likely" not in page
    with translation.override("zh-hans"):
        page = client.get(
            reverse("job_detail", args=[near.pk]), HTTP_ACCEPT_LANGUAGE="zh-hans"
        ).content.decode()
    assert "很可能在今天" in page


@time_machine.travel("2026-03-02 09:00:00+00:00", tick=False)
def test_a_running_job_has_no_range(alice: Any, cluster: Any, image: Any) -> None:
    job = _waiting(alice, timedelta(hours=20))
    job.state = Job.State.RUNNING
    assert job.estimated_start_range is None


@time_machine.travel("2026-03-02 09:00:00+00:00", tick=False)
def test_the_range_is_translated(alice: Any, cluster: Any, image: Any) -> None:
    job = _waiting(alice, timedelta(hours=20))
    with translation.override("zh-hans"):
        html = estimated_start_text(job)
    assert "很可能在" in html
    assert "比预测提前或推迟结束" in html

"""Why a job waits, and when it should start, as the member reads it: a booking's job is
never "likely" to start before its slot; a job without a booking is not told it waits for
its reservation; zero credit is named when it is the reason."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone, translation

from jobqueue.models import Job
from reservations.models import Reservation
from tests.jobqueue.test_approvals import waiting_job

pytestmark = pytest.mark.django_db


def waiting(owner: Any, **fields: Any) -> Job:
    job = waiting_job(owner)
    Job.objects.filter(pk=job.pk).update(**fields)
    job.refresh_from_db()
    return job


def test_a_booking_jobs_likely_start_is_never_before_its_slot(alice: Any) -> None:
    slot = timezone.now() + timedelta(hours=5)
    booking = Reservation.objects.create(user=alice, start=slot, end=slot + timedelta(hours=2))
    job = waiting(alice, reservation=booking, estimated_start=slot, pending_reason="reservation")
    span = job.estimated_start_range
    assert span is not None
    earliest, latest = span
    assert earliest >= slot and latest >= earliest
    # Without a booking the same estimate is uncertain on both sides.
    plain = waiting(alice, estimated_start=slot, pending_reason="resources")
    assert plain.estimated_start_range is not None
    assert plain.estimated_start_range[0] < slot


def test_a_job_without_a_booking_is_told_others_booked_the_gpus(alice: Any, bob: Any) -> None:
    slot = timezone.now() + timedelta(hours=1)
    booking = Reservation.objects.create(user=alice, start=slot, end=slot + timedelta(hours=2))
    mine = waiting(alice, reservation=booking, pending_reason="reservation")
    other = waiting(bob, pending_reason="reservation")
    with translation.override("en"):
        assert mine.pending_reason_text == "Waiting for its reservation's slot to begin."
        assert "its reservation" not in other.pending_reason_text
        assert "booked by others" in other.pending_reason_text
    with translation.override("zh-hans"):
        assert "他人预约" in other.pending_reason_text
        assert "你的预约" not in other.pending_reason_text


def test_zero_credit_is_said_to_the_owner_and_of_the_owner_to_others(alice: Any, bob: Any) -> None:
    job = waiting(alice, pending_reason="no_credit")
    with translation.override("en"):
        assert "Your credit is used up" in job.pending_reason_text_for(alice.pk)
        assert "Its owner's credit is used up" in job.pending_reason_text_for(bob.pk)
    with translation.override("zh-hans"):
        assert "积分" in job.pending_reason_text_for(alice.pk)

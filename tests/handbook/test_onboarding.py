"""The first-steps checklist is ticked from what each member did, and only from their own data."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from accounts.models import PersonalAccessToken
from handbook.selectors import onboarding_checklist
from handbook.services import onboarding_mark
from jobqueue.submit import job_submit
from reservations.services import reservation_create
from tests.factories import make_cluster

pytestmark = pytest.mark.django_db


def ticked(user: Any) -> set[str] | None:
    items = onboarding_checklist(user)
    return None if items is None else {i.key for i in items if i.done}


def test_each_step_is_ticked_by_doing_it_and_the_list_goes_when_all_are_done(
    alice: Any, charlie: Any, queues: Any, image: Any
) -> None:
    (node,) = make_cluster(nodes=1, gpus_per_node=2)
    assert ticked(alice) == set()

    job_submit(owner=charlie, queue="debug", image=image.reference, command="nvidia-smi")
    PersonalAccessToken.issue(user=charlie, name="charlie's")
    assert ticked(alice) == set()  # someone else's steps are not hers

    job_submit(owner=alice, queue="debug", image=image.reference, command="nvidia-smi")
    onboarding_mark(user=alice, rules_read=True)
    assert ticked(alice) == {"debug_job", "rules"}
    start = (timezone.now() + timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
    reservation_create(
        user=alice, node=node, gpu_count=1, start=start, end=start + timedelta(hours=1)
    )
    PersonalAccessToken.issue(user=alice, name="laptop")
    assert ticked(alice) is None


def test_history_from_before_the_member_joined_ticks_nothing(
    alice: Any, queues: Any, image: Any
) -> None:
    # A demo's seeded months, or jobs imported from before the account: not her steps.
    from jobqueue.models import Job
    from reservations.models import Reservation

    (node,) = make_cluster(nodes=1, gpus_per_node=2)
    job = job_submit(owner=alice, queue="debug", image=image.reference, command="nvidia-smi")
    long_ago = alice.date_joined - timedelta(days=60)
    Job.objects.filter(pk=job.pk).update(submitted_at=long_ago)
    booking = Reservation.objects.create(
        user=alice,
        start=long_ago,
        end=long_ago + timedelta(hours=2),
        state=Reservation.State.COMPLETED,
    )
    booking.gpus.set(node.gpus.all()[:1])
    assert ticked(alice) == set()


def test_a_put_away_checklist_stays_away(alice: Any) -> None:
    onboarding_mark(user=alice, dismissed=True)
    assert onboarding_checklist(alice) is None

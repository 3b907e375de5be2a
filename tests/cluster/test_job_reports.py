from __future__ import annotations

from typing import Any

import pytest

from cluster.models import RejectedMessage
from scheduling.tasks import job_event, job_logs_report

pytestmark = pytest.mark.django_db


def an_event(job_id: int, kind: str = "started", **overrides: Any) -> dict[str, Any]:
    event = {
        "event_id": f"evt-{job_id}-{kind}",
        "job_id": job_id,
        "kind": kind,
        "ts": 1.0e9,
        "container_id": "c0ffee",
        "exit_code": None,
        "log_tail": None,
        "reason": None,
    }
    event.update(overrides)
    return event


@pytest.fixture
def alices_job_here(registered_node: Any, alice: Any) -> Any:
    from tests.cluster.conftest import job_on

    return job_on(registered_node[0], alice)


@pytest.fixture
def bobs_job_elsewhere(other_node: Any, bob: Any) -> Any:
    from tests.cluster.conftest import job_on

    return job_on(other_node, bob)


def test_a_job_event_for_a_job_on_this_node_goes_to_the_job_queue(
    registered_node: Any, alices_job_here: Any, jobqueue_calls: Any
) -> None:
    _node, secret = registered_node

    assert job_event("gpu01", secret, an_event(alices_job_here.pk)) == "ok"

    assert jobqueue_calls.events == [{"node_name": "gpu01", "event": an_event(alices_job_here.pk)}]


def test_a_job_event_for_a_job_on_another_node_is_refused(
    registered_node: Any, bobs_job_elsewhere: Any, jobqueue_calls: Any
) -> None:
    _node, secret = registered_node

    result = job_event("gpu01", secret, an_event(bobs_job_elsewhere.pk, "exited", exit_code=0))

    assert result == "refused: job_not_on_node"
    assert jobqueue_calls.events == []
    assert RejectedMessage.objects.get().reason == "job_not_on_node"


def test_a_job_event_with_a_wrong_token_is_refused(
    registered_node: Any, alices_job_here: Any, jobqueue_calls: Any
) -> None:
    assert job_event("gpu01", "lpn_wrong", an_event(alices_job_here.pk)) == "refused: bad_token"
    assert jobqueue_calls.events == []


def test_the_exit_of_a_job_that_already_ended_still_reaches_the_job_queue(
    registered_node: Any, alice: Any, jobqueue_calls: Any
) -> None:
    from tests.cluster.conftest import job_on

    lost_job = job_on(registered_node[0], alice, state="lost")

    assert (
        job_event("gpu01", registered_node[1], an_event(lost_job.pk, "exited", exit_code=0)) == "ok"
    )
    assert len(jobqueue_calls.events) == 1


@pytest.mark.parametrize(
    "event",
    [
        "started",
        {"event_id": "e1", "job_id": "7", "kind": "started"},
        {"event_id": "e1", "job_id": 7, "kind": "exploded"},
        {"event_id": "", "job_id": 7, "kind": "started"},
        {"event_id": "e1", "job_id": True, "kind": "started"},
        {"event_id": "e1", "job_id": 7, "kind": "exited", "exit_code": "0"},
    ],
)
def test_a_malformed_job_event_is_refused(
    registered_node: Any, jobqueue_calls: Any, event: Any
) -> None:
    assert job_event("gpu01", registered_node[1], event) == "refused: malformed"
    assert jobqueue_calls.events == []


def test_a_job_event_delivered_twice_is_passed_on_with_the_same_event_id(
    registered_node: Any, alices_job_here: Any, jobqueue_calls: Any
) -> None:
    for _ in range(2):
        job_event("gpu01", registered_node[1], an_event(alices_job_here.pk))

    assert {call["event"]["event_id"] for call in jobqueue_calls.events} == {
        f"evt-{alices_job_here.pk}-started"
    }


def test_logs_of_a_job_on_this_node_are_stored(
    registered_node: Any, alices_job_here: Any, jobqueue_calls: Any
) -> None:
    assert (
        job_logs_report("gpu01", registered_node[1], alices_job_here.pk, "epoch 1 loss 0.3\n")
        == "ok"
    )
    assert jobqueue_calls.logs == [{"job_id": alices_job_here.pk, "text": "epoch 1 loss 0.3\n"}]


def test_logs_of_a_job_on_another_node_are_refused(
    registered_node: Any, bobs_job_elsewhere: Any, jobqueue_calls: Any
) -> None:
    result = job_logs_report("gpu01", registered_node[1], bobs_job_elsewhere.pk, "fake output")

    assert result == "refused: job_not_on_node"
    assert jobqueue_calls.logs == []


def test_job_reports_from_an_unknown_node_are_refused(
    issue_token: Any, jobqueue_calls: Any
) -> None:
    secret = issue_token("ghost")

    assert job_event("ghost", secret, an_event(1)) == "refused: not_registered"
    assert job_logs_report("ghost", secret, 1, "x") == "refused: not_registered"

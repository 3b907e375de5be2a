from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.test import override_settings
from django.utils import timezone

from cluster.models import Node, RejectedMessage
from cluster.services import node_set_drain
from cluster.tasks import node_heartbeat, nodes_check_liveness
from tests.factories import NodeFactory

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.usefixtures("jobqueue_calls", "control_heard_throughout"),
]

HEARTBEAT = {"ts": 0.0, "running_job_ids": []}


@override_settings(LABPORTAL_NODE_DOWN_AFTER_S=60, LABPORTAL_NODE_LOST_GRACE_S=300)
def test_a_silent_node_goes_down_and_after_the_grace_its_jobs_are_lost_once(
    registered_node: Any, jobqueue_calls: Any
) -> None:
    node, _secret = registered_node
    start = timezone.now()
    with time_machine.travel(start + timedelta(seconds=59), tick=False):
        nodes_check_liveness()
        assert Node.objects.get(pk=node.pk).state == Node.State.UP

    with time_machine.travel(start + timedelta(seconds=61), tick=False):
        assert nodes_check_liveness() == {"marked_down": ["gpu01"], "jobs_lost": {}}
    node.refresh_from_db()
    assert node.state == Node.State.DOWN
    assert node.down_since == start + timedelta(seconds=61)

    with time_machine.travel(start + timedelta(seconds=61 + 299), tick=False):
        nodes_check_liveness()
    assert jobqueue_calls.lost == []

    with time_machine.travel(start + timedelta(seconds=61 + 301), tick=False):
        assert nodes_check_liveness() == {"marked_down": [], "jobs_lost": {"gpu01": 1}}
        nodes_check_liveness()
    assert len(jobqueue_calls.lost) == 1
    assert jobqueue_calls.lost[0]["node_id"] == node.pk
    assert "gpu01" in jobqueue_calls.lost[0]["reason"]


@override_settings(LABPORTAL_NODE_DOWN_AFTER_S=60)
def test_a_heartbeat_keeps_the_node_up(registered_node: Any) -> None:
    node, secret = registered_node
    start = timezone.now()
    with time_machine.travel(start + timedelta(seconds=50), tick=False):
        assert node_heartbeat("gpu01", secret, HEARTBEAT) == "ok"
    with time_machine.travel(start + timedelta(seconds=100), tick=False):
        nodes_check_liveness()
    assert Node.objects.get(pk=node.pk).state == Node.State.UP


@override_settings(LABPORTAL_NODE_DOWN_AFTER_S=60, LABPORTAL_NODE_LOST_GRACE_S=300)
def test_a_down_node_that_speaks_again_comes_back_and_can_lose_jobs_again_later(
    registered_node: Any, jobqueue_calls: Any
) -> None:
    node, secret = registered_node
    start = timezone.now()
    with time_machine.travel(start + timedelta(seconds=1000), tick=False):
        nodes_check_liveness()
    with time_machine.travel(start + timedelta(seconds=1400), tick=False):
        nodes_check_liveness()
        node_heartbeat("gpu01", secret, HEARTBEAT)
    node.refresh_from_db()
    assert (node.state, node.down_since, node.jobs_lost_at) == (Node.State.UP, None, None)
    with time_machine.travel(start + timedelta(seconds=1400 + 61), tick=False):
        nodes_check_liveness()
    with time_machine.travel(start + timedelta(seconds=1400 + 61 + 301), tick=False):
        nodes_check_liveness()
    assert len(jobqueue_calls.lost) == 2


def test_a_down_node_with_drain_requested_comes_back_draining(registered_node: Any) -> None:
    node, secret = registered_node
    node_set_drain(node_id=node.pk, drain=True)
    Node.objects.filter(pk=node.pk).update(state=Node.State.DOWN, down_since=timezone.now())

    node_heartbeat("gpu01", secret, HEARTBEAT)

    assert Node.objects.get(pk=node.pk).state == Node.State.DRAINING


def test_a_heartbeat_with_a_wrong_token_changes_nothing(registered_node: Any) -> None:
    node, _secret = registered_node
    Node.objects.filter(pk=node.pk).update(state=Node.State.DOWN, last_heartbeat=None)

    assert node_heartbeat("gpu01", "lpn_wrong", HEARTBEAT) == "refused: bad_token"

    node.refresh_from_db()
    assert (node.state, node.last_heartbeat) == (Node.State.DOWN, None)


def test_a_heartbeat_from_a_node_that_never_registered_is_refused(issue_token: Any) -> None:
    NodeFactory(name="gpu05", state=Node.State.DOWN)
    secret = issue_token("gpu05")

    assert node_heartbeat("gpu05", secret, HEARTBEAT) == "refused: not_registered"
    assert Node.objects.get(name="gpu05").state == Node.State.DOWN
    assert RejectedMessage.objects.get().reason == "not_registered"


def test_jobs_are_declared_lost_again_on_the_next_beat_if_the_job_queue_failed(
    registered_node: Any, jobqueue_calls: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    node, _secret = registered_node
    Node.objects.filter(pk=node.pk).update(
        state=Node.State.DOWN, down_since=timezone.now() - timedelta(days=1)
    )

    def broken(**kwargs: Any) -> int:
        raise RuntimeError("database hiccup")

    monkeypatch.setattr("scheduling.agent_events.jobs_mark_lost_on_node", broken)
    assert nodes_check_liveness()["jobs_lost"] == {}
    assert Node.objects.get(pk=node.pk).jobs_lost_at is None

    monkeypatch.setattr(
        "scheduling.agent_events.jobs_mark_lost_on_node",
        lambda **kwargs: jobqueue_calls.lost.append(kwargs) or 2,
    )
    assert nodes_check_liveness()["jobs_lost"] == {"gpu01": 2}

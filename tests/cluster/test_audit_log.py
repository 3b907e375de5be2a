"""The audit log holds people's changes to the machines, not the agents' own: heartbeats,
silences and re-registrations write nothing; a lab admin's drain is logged, with who."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import time_machine
from auditlog.models import LogEntry
from django.contrib.auth.models import Permission
from django.test import Client, override_settings
from django.utils import timezone

from cluster.models import Gpu, Node
from cluster.tasks import node_heartbeat, node_register, nodes_check_liveness
from tests.cluster.conftest import gpu_entry, register_info
from tests.factories import UserFactory

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.usefixtures("jobqueue_calls", "control_heard_throughout"),
]

HEARTBEAT = {"ts": 0.0, "running_job_ids": []}


def machine_entries() -> list[Any]:
    return list(
        LogEntry.objects.filter(content_type__model__in=["node", "gpu"]).order_by("timestamp")
    )


@override_settings(LABPORTAL_NODE_DOWN_AFTER_S=60)
def test_heartbeats_silences_and_registrations_are_not_logged_but_a_drain_is(
    registered_node: Any, client: Client
) -> None:
    node, secret = registered_node
    start = timezone.now()
    for seconds in (10, 20, 30):
        with time_machine.travel(start + timedelta(seconds=seconds), tick=False):
            assert node_heartbeat("gpu01", secret, HEARTBEAT) == "ok"
    with time_machine.travel(start + timedelta(seconds=200), tick=False):
        nodes_check_liveness()  # silent: marked down
    assert Node.objects.get(pk=node.pk).state == Node.State.DOWN
    # The agent comes back, once without its second GPU, then with it again.
    node_register("gpu01", secret, register_info(gpu_entry("GPU-aaa", 0)))
    assert Gpu.objects.get(uuid="GPU-bbb").state == Gpu.State.MISSING
    node_register("gpu01", secret, register_info(gpu_entry("GPU-aaa", 0), gpu_entry("GPU-bbb", 1)))
    assert node_heartbeat("gpu01", secret, HEARTBEAT) == "ok"
    assert machine_entries() == []

    dora = UserFactory.create(username="dora", is_staff=True)
    dora.user_permissions.add(*Permission.objects.filter(codename__in=["view_node", "change_node"]))
    client.force_login(dora)
    response = client.post(
        "/admin/cluster/node/", {"action": "drain", "_selected_action": [node.pk]}
    )

    assert response.status_code == 302
    [drain] = machine_entries()
    assert drain.actor == dora and drain.object_repr == "gpu01"
    assert drain.changes_dict == {"drain_requested": ["False", "True"]}

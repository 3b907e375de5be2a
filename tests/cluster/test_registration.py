from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from cluster.models import Gpu, Node, NodeToken, RejectedMessage
from cluster.tasks import node_register
from tests.cluster.conftest import gpu_entry, register_info
from tests.factories import NodeFactory

pytestmark = pytest.mark.django_db


def rejections(reason: str) -> int:
    return sum(r.count for r in RejectedMessage.objects.filter(reason=reason))


def test_registration_with_a_good_token_creates_the_node_and_its_gpus(issue_token: Any) -> None:
    secret = issue_token("gpu01")

    result = node_register(
        "gpu01", secret, register_info(gpu_entry("GPU-aaa", 0), gpu_entry("GPU-bbb", 1))
    )

    assert result == "ok"
    node = Node.objects.get(name="gpu01")
    assert node.state == Node.State.UP
    assert (node.hostname, node.agent_version, node.gpu_backend, node.runtime) == (
        "gpu01.lab.example",
        "0.1.0",
        "nvml",
        "docker",
    )
    assert node.registered_at is not None and node.last_heartbeat is not None
    assert sorted(node.gpus.values_list("uuid", "index", "state")) == [
        ("GPU-aaa", 0, "available"),
        ("GPU-bbb", 1, "available"),
    ]


def test_registration_with_a_wrong_token_is_refused_and_counted(issue_token: Any) -> None:
    issue_token("gpu01")

    result = node_register("gpu01", "lpn_not-the-secret", register_info(gpu_entry("GPU-aaa")))

    assert result == "refused: bad_token"
    assert not Node.objects.filter(name="gpu01").exists()
    row = RejectedMessage.objects.get()
    assert (row.node_name, row.message, row.reason, row.count) == (
        "gpu01",
        "node_register",
        "bad_token",
        1,
    )


def test_a_token_of_another_node_cannot_register_this_one(issue_token: Any) -> None:
    secret_of_gpu02 = issue_token("gpu02")

    assert node_register("gpu01", secret_of_gpu02, register_info()) == "refused: bad_token"
    assert not Node.objects.exists()


def test_registration_with_a_revoked_token_is_refused(issue_token: Any) -> None:
    secret = issue_token("gpu01")
    NodeToken.objects.update(revoked_at=timezone.now())

    assert (
        node_register("gpu01", secret, register_info(gpu_entry("GPU-aaa"))) == "refused: bad_token"
    )
    assert not Node.objects.exists()


def test_repeated_refusals_add_to_one_counter(issue_token: Any) -> None:
    for _ in range(3):
        node_register("gpu01", "wrong", register_info())
    node_register("gpu01", None, register_info())

    assert RejectedMessage.objects.count() == 1
    assert RejectedMessage.objects.get().count == 4


def test_a_gpu_that_disappears_is_marked_missing_not_deleted(registered_node: Any) -> None:
    node, secret = registered_node

    node_register("gpu01", secret, register_info(gpu_entry("GPU-aaa", 0)))

    assert Gpu.objects.get(uuid="GPU-bbb").state == Gpu.State.MISSING
    assert Gpu.objects.get(uuid="GPU-aaa").state == Gpu.State.AVAILABLE


def test_a_missing_gpu_that_reappears_becomes_available_again(registered_node: Any) -> None:
    node, secret = registered_node
    node_register("gpu01", secret, register_info(gpu_entry("GPU-aaa", 0)))

    node_register("gpu01", secret, register_info(gpu_entry("GPU-aaa", 0), gpu_entry("GPU-bbb", 1)))

    assert Gpu.objects.get(uuid="GPU-bbb").state == Gpu.State.AVAILABLE


def test_a_gpu_an_admin_disabled_stays_disabled_when_the_agent_registers_again(
    registered_node: Any,
) -> None:
    node, secret = registered_node
    Gpu.objects.filter(uuid="GPU-aaa").update(state=Gpu.State.DISABLED)

    node_register("gpu01", secret, register_info(gpu_entry("GPU-aaa", 0), gpu_entry("GPU-bbb", 1)))

    assert Gpu.objects.get(uuid="GPU-aaa").state == Gpu.State.DISABLED


def test_registering_twice_changes_nothing_the_second_time(registered_node: Any) -> None:
    node, secret = registered_node
    before = list(Gpu.objects.order_by("uuid").values("pk", "uuid", "state", "node_id"))

    node_register("gpu01", secret, register_info(gpu_entry("GPU-aaa", 0), gpu_entry("GPU-bbb", 1)))

    assert list(Gpu.objects.order_by("uuid").values("pk", "uuid", "state", "node_id")) == before
    assert Node.objects.count() == 1


def test_mig_instances_register_under_their_parent(issue_token: Any) -> None:
    secret = issue_token("gpu01")
    info = register_info(
        gpu_entry("GPU-parent", 0),
        gpu_entry(
            "MIG-one", 0, kind="mig", parent_uuid="GPU-parent", memory_mb=9728, model="1g.10gb"
        ),
    )

    node_register("gpu01", secret, info)

    mig = Gpu.objects.get(uuid="MIG-one")
    assert mig.parent is not None
    assert (mig.kind, mig.parent.uuid, mig.memory_mb) == ("mig", "GPU-parent", 9728)


def test_a_mig_instance_whose_parent_was_not_reported_is_refused_and_the_rest_registers(
    issue_token: Any,
) -> None:
    secret = issue_token("gpu01")
    info = register_info(
        gpu_entry("GPU-aaa", 0), gpu_entry("MIG-orphan", 1, kind="mig", parent_uuid="GPU-nope")
    )

    assert node_register("gpu01", secret, info) == "ok"

    assert list(Gpu.objects.values_list("uuid", flat=True)) == ["GPU-aaa"]
    assert rejections("malformed") == 1


def test_malformed_gpu_entries_are_refused_and_the_good_ones_register(issue_token: Any) -> None:
    secret = issue_token("gpu01")
    # Raw agent payload, malformed on purpose: an index that is not a number, an entry not a dict.
    info = register_info(
        gpus=[gpu_entry("GPU-good", 0), {**gpu_entry("GPU-bad"), "index": "zero"}, "not a gpu"]
    )

    assert node_register("gpu01", secret, info) == "ok"

    assert list(Gpu.objects.values_list("uuid", flat=True)) == ["GPU-good"]
    assert rejections("malformed") == 2


def test_an_info_that_is_not_an_object_is_refused(issue_token: Any) -> None:
    secret = issue_token("gpu01")

    assert node_register("gpu01", secret, ["nope"]) == "refused: malformed"
    assert not Node.objects.exists()


def test_a_node_cannot_claim_a_gpu_that_is_present_on_another_node(
    issue_token: Any, other_node: Node
) -> None:
    secret = issue_token("gpu01")

    node_register(
        "gpu01", secret, register_info(gpu_entry("GPU-mine", 0), gpu_entry("GPU-other-0", 1))
    )

    assert Gpu.objects.get(uuid="GPU-other-0").node == other_node
    assert Gpu.objects.get(uuid="GPU-mine").node.name == "gpu01"
    assert rejections("gpu_on_other_node") == 1


def test_a_gpu_moved_from_a_node_where_it_went_missing_follows_it(
    issue_token: Any, other_node: Node
) -> None:
    Gpu.objects.filter(uuid="GPU-other-0").update(state=Gpu.State.MISSING)
    secret = issue_token("gpu01")

    node_register("gpu01", secret, register_info(gpu_entry("GPU-other-0", 3)))

    moved = Gpu.objects.get(uuid="GPU-other-0")
    assert (moved.node.name, moved.index, moved.state) == ("gpu01", 3, "available")


def test_a_node_with_drain_requested_registers_as_draining(issue_token: Any) -> None:
    NodeFactory(name="gpu01", state=Node.State.DOWN, drain_requested=True)
    secret = issue_token("gpu01")

    node_register("gpu01", secret, register_info(gpu_entry("GPU-aaa")))

    assert Node.objects.get(name="gpu01").state == Node.State.DRAINING


@override_settings(LABPORTAL_ALLOW_SIMULATION=False)
def test_a_simulated_node_is_refused_when_simulation_is_not_allowed(issue_token: Any) -> None:
    secret = issue_token("sim01")

    result = node_register(
        "sim01", secret, register_info(gpu_entry("GPU-sim-sim01-0"), gpu_backend="simulated")
    )

    assert result == "refused: simulation_refused"
    assert not Node.objects.exists() and not Gpu.objects.exists()


@override_settings(LABPORTAL_ALLOW_SIMULATION=False)
def test_a_node_that_falls_back_to_simulation_is_taken_out_of_service(registered_node: Any) -> None:
    node, secret = registered_node

    node_register("gpu01", secret, register_info(gpu_entry("GPU-aaa"), runtime="local"))

    node.refresh_from_db()
    assert node.state == Node.State.DOWN and node.registered_at is None
    assert node.gpu_backend == "nvml"


@override_settings(LABPORTAL_ALLOW_SIMULATION=True)
def test_a_simulated_node_registers_when_simulation_is_allowed(issue_token: Any) -> None:
    secret = issue_token("sim01")

    node_register(
        "sim01",
        secret,
        register_info(gpu_entry("GPU-sim-sim01-0"), gpu_backend="simulated", runtime="local"),
    )

    assert Node.objects.get(name="sim01").is_simulated


def test_a_slot_of_a_missing_gpu_goes_missing_with_it(registered_node: Any) -> None:
    node, secret = registered_node
    from cluster.services import gpu_set_shared_slots

    parent = Gpu.objects.get(uuid="GPU-bbb")
    gpu_set_shared_slots(gpu_id=parent.pk, slots=2)
    slot = Gpu.objects.get(parent=parent, uuid="GPU-bbb::slot0")

    node_register("gpu01", secret, register_info(gpu_entry("GPU-aaa", 0)))
    slot.refresh_from_db()
    assert slot.state == Gpu.State.MISSING

    node_register("gpu01", secret, register_info(gpu_entry("GPU-aaa", 0), gpu_entry("GPU-bbb", 1)))
    slot.refresh_from_db()
    assert slot.state == Gpu.State.AVAILABLE

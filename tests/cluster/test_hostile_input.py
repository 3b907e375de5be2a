"""Agent messages that pass the old validation but crashed the task: each is refused or made
storable, and always ends up in the rejected-message log rather than vanishing.

Run on PostgreSQL too (the `postgres` pass of CI): NUL is what PostgreSQL refuses.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from cluster.models import Gpu, Node, RejectedMessage
from cluster.tasks import node_heartbeat, node_register
from jobqueue.models import Job, JobEvent
from protocol import messages as protocol
from scheduling.tasks import job_event, job_logs_report
from telemetry.tasks import samples_ingest
from tests.cluster.conftest import gpu_entry, job_on, register_info
from tests.cluster.test_job_reports import an_event

pytestmark = pytest.mark.django_db


def rejection(message: str) -> RejectedMessage:
    return RejectedMessage.objects.get(message=message)


def test_the_protocol_limits_are_the_columns_limits() -> None:
    def max_length(model: Any, field: str) -> int:
        return int(model._meta.get_field(field).max_length)

    assert max_length(JobEvent, "event_id") == protocol.MAX_EVENT_ID_CHARS
    assert max_length(Job, "container_id") == protocol.MAX_CONTAINER_ID_CHARS
    assert max_length(Node, "name") == protocol.MAX_NODE_NAME_CHARS
    assert max_length(Gpu, "uuid") == protocol.MAX_GPU_UUID_CHARS
    # Job.exit_code is an IntegerField: a signed 32-bit column on every database.
    assert (protocol.MIN_EXIT_CODE, protocol.MAX_EXIT_CODE) == (-(2**31), 2**31 - 1)


def test_a_nul_in_the_hostname_is_replaced_and_the_node_registers(issue_token: Any) -> None:
    secret = issue_token("gpu01")
    info = register_info(gpu_entry("GPU-aaa"), hostname="gpu\x0001", agent_version="0.1\x00")

    assert node_register("gpu01", secret, info) == "ok"

    node = Node.objects.get(name="gpu01")
    assert node.hostname == "gpu\ufffd01" and node.agent_version == "0.1\ufffd"


def test_a_gpu_uuid_with_a_nul_is_set_aside_and_the_others_register(issue_token: Any) -> None:
    secret = issue_token("gpu01")
    info = register_info(gpu_entry("GPU-\x00bad", 0), gpu_entry("GPU-good", 1))

    assert node_register("gpu01", secret, info) == "ok"

    assert list(Gpu.objects.values_list("uuid", flat=True)) == ["GPU-good"]
    assert "control characters" in rejection("node_register").last_detail


@pytest.mark.parametrize("name", ["gpu\x0001", "gpu01\ud800", "x" * 64, "../etc"])
def test_a_malformed_node_name_is_refused_and_logged_without_crashing(
    name: str, issue_token: Any
) -> None:
    secret = issue_token("gpu01")

    assert node_heartbeat(name, secret, {"ts": 1.0}) == "refused: bad_token"

    rejected = rejection("node_heartbeat")
    assert rejected.reason == "bad_token" and "\x00" not in rejected.node_name


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"event_id": "e" * 180}, "event_id is longer than 160"),
        ({"ts": 1e20}, "ts must be null or epoch seconds"),
        ({"ts": -5}, "ts must be null or epoch seconds"),
        ({"exit_code": 2**40}, "exit_code must be null or an integer"),
        ({"job_id": 2**70}, "job_id must be a positive integer"),
        ({"event_id": "evt\x00-1"}, "event_id contains control characters"),
        ({"container_id": "c" * 81}, "container_id is longer than 80"),
    ],
)
def test_an_event_outside_the_protocols_limits_is_refused_and_logged(
    overrides: dict[str, Any], expected: str, registered_node: Any, alice: Any
) -> None:
    node, secret = registered_node
    job = job_on(node, alice)

    event = {**an_event(job.pk, "exited"), **overrides}

    assert job_event("gpu01", secret, event) == "refused: malformed"

    assert expected in rejection("job_event").last_detail
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING


def test_an_exit_whose_log_holds_nul_and_a_lone_surrogate_ends_the_job(
    registered_node: Any, alice: Any
) -> None:
    node, secret = registered_node
    job = job_on(node, alice)
    exited = an_event(
        job.pk, "exited", exit_code=0, log_tail="loss 0.1\x00\x00\nbad \ud800 byte\n", ts=None
    )

    assert job_event("gpu01", secret, exited) == "ok"

    job.refresh_from_db()
    assert job.state == Job.State.COMPLETED
    assert job.log_tail == "loss 0.1\ufffd\ufffd\nbad \ufffd byte\n"


def test_a_log_report_with_nul_is_stored_readably(registered_node: Any, alice: Any) -> None:
    node, secret = registered_node
    job = job_on(node, alice)

    assert job_logs_report("gpu01", secret, job.pk, "step 1\x00\nstep 2\n") == "ok"

    job.refresh_from_db()
    assert job.log_tail == "step 1\ufffd\nstep 2\n"


def test_a_sample_whose_gpu_uuid_or_container_holds_nul_is_refused_alone(
    registered_node: Any,
) -> None:
    _node, secret = registered_node
    now = time.time()
    good = {"gpu_uuid": "GPU-aaa", "ts": now, "util_pct": 50}
    bad_uuid = {"gpu_uuid": "GPU-\x00aaa", "ts": now, "util_pct": 50}
    bad_process = {
        "gpu_uuid": "GPU-bbb",
        "ts": now,
        "processes": [{"pid": 1, "used_mb": 1, "container_id": "c\x00", "job_id": None}],
    }

    assert samples_ingest("gpu01", secret, [good, bad_uuid, bad_process]) == "ok"

    assert Gpu.objects.get(uuid="GPU-aaa").samples.count() == 1
    assert rejection("samples_ingest").count == 2


def test_an_event_that_fails_to_apply_is_rolled_back_and_logged(
    registered_node: Any, alice: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scheduling import agent_events as job_services

    node, secret = registered_node
    job = job_on(node, alice)
    real_apply = job_services.job_event_apply

    def half_applied(*, node_name: str, event: dict[str, Any]) -> None:
        real_apply(node_name=node_name, event=event)
        raise ValueError("a bug after the write")

    monkeypatch.setattr(job_services, "job_event_apply", half_applied)

    result = job_event("gpu01", secret, an_event(job.pk, "exited", exit_code=0, ts=None))

    assert result == "refused: apply_failed"
    assert "ValueError: a bug after the write" in rejection("job_event").last_detail
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING, "a failed event must change nothing"
    assert not JobEvent.objects.filter(job=job, kind="exited").exists()


def test_a_heartbeat_with_a_malformed_job_list_still_counts_as_alive(
    registered_node: Any,
) -> None:
    node, secret = registered_node
    Node.objects.filter(pk=node.pk).update(last_heartbeat=None)

    result = node_heartbeat("gpu01", secret, {"ts": 1.0, "running_job_ids": ["7", None]})

    assert result == "refused: malformed"
    node.refresh_from_db()
    assert node.last_heartbeat is not None

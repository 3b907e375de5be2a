"""The control task for the agents' log chunks: signed, checked, stored once."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from cluster.models import RejectedMessage
from joblogs.selectors import latest_log, log_bytes
from joblogs.tasks import job_log_chunk
from tests.cluster.conftest import job_on
from tests.cluster.test_signed_messages import signed_report

pytestmark = pytest.mark.django_db


def chunk(job_id: int, offset: int, data: bytes, **kw: Any) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "stream": kw.get("stream", "local-1-99"),
        "offset": offset,
        "data": base64.b64encode(data).decode(),
        "final": kw.get("final", False),
    }


def send(node: str, secret: str, message: dict[str, Any]) -> str:
    auth = signed_report("control.job_log_chunk", node, [message], secret)
    return str(job_log_chunk(node, auth, message))


def test_a_signed_chunk_is_stored_and_the_same_bytes_sent_again_add_nothing(
    running_job: Any, node_secret: str
) -> None:
    assert send("gpu01", node_secret, chunk(running_job.pk, 0, b"epoch 1\n")) == "ok"
    # The agent resends after a restart: a new signature, the same bytes.
    assert send("gpu01", node_secret, chunk(running_job.pk, 0, b"epoch 1\n")) == "ok"
    assert send("gpu01", node_secret, chunk(running_job.pk, 8, b"", final=True)) == "ok"
    log = latest_log(running_job)
    assert log is not None and log.complete
    assert b"".join(log_bytes(log)) == b"epoch 1\n"


def test_a_replayed_report_is_refused(running_job: Any, node_secret: str) -> None:
    message = chunk(running_job.pk, 0, b"x")
    auth = signed_report("control.job_log_chunk", "gpu01", [message], node_secret)
    assert job_log_chunk("gpu01", auth, message) == "ok"
    assert job_log_chunk("gpu01", auth, message) == "refused: bad_token"


def test_a_chunk_for_a_job_of_another_node_is_refused(
    registered_node: Any, node_secret: str, alice: Any
) -> None:
    elsewhere = job_on(None, alice)
    assert send("gpu01", node_secret, chunk(elsewhere.pk, 0, b"x")) == "refused: job_not_on_node"
    assert latest_log(elsewhere) is None


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        ({"data": "not base64!"}, "base64"),
        ({"offset": -1}, "offset"),
        ({"stream": ""}, "stream"),
        ({"data": base64.b64encode(b"x" * (256 * 1024 + 3)).decode()}, "data"),
    ],
)
def test_a_malformed_chunk_is_refused_saying_why(
    running_job: Any, node_secret: str, change: dict[str, Any], detail: str
) -> None:
    message = chunk(running_job.pk, 0, b"x") | change
    assert send("gpu01", node_secret, message) == "refused: malformed"
    rejected = RejectedMessage.objects.get(message="job_log_chunk")
    assert detail in rejected.last_detail
    assert latest_log(running_job) is None

"""The malformed broker messages of test_malformed_broker_messages.py, on the demo's broker.

The demo needs no broker server: kombu's filesystem transport keeps each message in a
file ``<milliseconds>_<uuid>.<queue>.msg`` of one folder (var/broker/out), which the
control worker and the agents poll; protocol.broker guards it like the Redis transport.
Here the same 17 payloads are written raw as such files, for the control worker and for
an agent's ``node.<name>`` queue; both processes stay up, each drop is recorded, and
heartbeats go on landing.

With kombu's stock filesystem transport and Celery's stock consumer put back (in
``protocol.broker.install`` and ``CONSUMER``), the control worker and the agent both exit
with 1 ("Unrecoverable error": a JSONDecodeError or a KeyError of 'properties') on the
first file that is not JSON or not a kombu message. Run it with ``PYTHONPATH=$PWD`` from
a second checkout: the agent's command otherwise imports the installed (editable) tree.

The processes run against a private PostgreSQL (see test_outages.py) and no Redis: the
cache is the demo's file cache. Every wait is bounded; nothing is asserted on timing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.reliability.test_malformed_broker_messages import (
    each_drop_recorded_and_the_control_worker_works,
    heartbeats_go_on,
    payloads,
)
from tests.reliability.test_outages import Lab

pytestmark = [pytest.mark.e2e]


def queue_folder(lab: Lab) -> Path:
    """The folder both processes read and write their messages in."""
    return Path(urlsplit(lab.broker_url).path)


def write(lab: Lab, queue: str, payload: bytes | str) -> str:
    """Put `payload` on `queue` as kombu's filesystem transport names a message; its name.

    Written under a name no consumer takes (it does not end in ``.<queue>.msg``), then
    renamed into place, so that no worker reads it half-written.
    """
    folder = queue_folder(lab)
    data = payload.encode() if isinstance(payload, str) else payload
    name = f"{int(round(time.monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
    partial = folder / f".{uuid.uuid4()}.partial"
    partial.write_bytes(data)
    partial.rename(folder / name)
    return name


def write_all(lab: Lab, queue: str, cases: dict[str, bytes | str]) -> None:
    """Write each payload onto `queue` and wait until the consumer has taken them all."""
    folder = queue_folder(lab)
    names = [write(lab, queue, payload) for payload in cases.values()]
    lab.wait(
        lambda: not any((folder / name).exists() for name in names),
        timeout_s=60,
        what=f"the {len(names)} messages to be taken off {queue}",
    )


def refused_by_the_agent(lab: Lab) -> int:
    """How many commands the agent reported refusing (control.command_refused)."""
    rows = lab.sql(
        "SELECT coalesce(sum(count), 0) FROM cluster_rejectedmessage"
        " WHERE node_name = %s AND message LIKE 'agent refused%%'",
        lab.node,
    )
    return int(rows[0][0])


def test_the_control_worker_drops_each_malformed_message_file_and_keeps_working(
    start_lab: Callable[..., Lab],
) -> None:
    lab = start_lab(broker="filesystem", LABPORTAL_LIVENESS_CHECK_S="2")
    lab.start_agent(LABPORTAL_HEARTBEAT_INTERVAL="2")
    cases = payloads("control", "control.node_heartbeat")
    write_all(lab, "control", cases)
    each_drop_recorded_and_the_control_worker_works(lab, cases)


def test_the_agent_drops_each_malformed_command_file_and_keeps_working(
    start_lab: Callable[..., Lab],
) -> None:
    lab = start_lab(broker="filesystem", LABPORTAL_LIVENESS_CHECK_S="2")
    lab.start_agent(LABPORTAL_HEARTBEAT_INTERVAL="2")
    queue = f"node.{lab.node}"
    cases = payloads(queue, "agent.job_logs")
    write_all(lab, queue, cases)
    lab.wait(
        lambda: refused_by_the_agent(lab) >= len(cases),
        timeout_s=60,
        what=f"the agent's refusals of {len(cases)} malformed commands to be recorded",
    )
    lab.stack.check_alive()  # the agent (and the control worker) still run
    heartbeats_go_on(lab)
    lab.stack.check_alive()

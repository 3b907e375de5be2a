"""Malformed broker messages against a real control worker and a real agent (issue 25).

One LPUSH of "", '{}' or 'not json' onto the control queue stopped the control worker
("Unrecoverable error"), and 'not json' on `node.<name>` stopped the agent: anyone who
can reach the broker could repeat it after every restart. Now each one is dropped,
logged and recorded for admins, and both processes go on handling valid messages.

The processes run against a private PostgreSQL and Redis (see test_outages.py). Every
wait is bounded; nothing is asserted on timing.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.reliability.test_outages import Lab

pytestmark = [pytest.mark.e2e, pytest.mark.redis]


def envelope(queue: str, headers: Any, body: bytes, **properties: Any) -> str:
    props = {
        "correlation_id": "x",
        "reply_to": "",
        "delivery_mode": 2,
        "delivery_info": {"exchange": "", "routing_key": queue},
        "priority": 0,
        "body_encoding": "base64",
        "delivery_tag": str(uuid.uuid4()),
        **properties,
    }
    return json.dumps(
        {
            "body": base64.b64encode(body).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": props,
        }
    )


def task(queue: str, name: str, args: list[Any], **headers: Any) -> str:
    fields = {
        "lang": "py",
        "task": name,
        "id": str(uuid.uuid4()),
        "root_id": None,
        "parent_id": None,
        "group": None,
        "retries": 0,
        "eta": None,
        "expires": None,
        "timelimit": [None, None],
        "origin": "attacker",
        "ignore_result": True,
        **headers,
    }
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    return envelope(queue, fields, json.dumps([args, {}, embed]).encode())


def payloads(queue: str, known_task: str) -> dict[str, bytes | str]:
    """Each kind of message that stopped a worker before (11 of these 17 did)."""
    header = {"task": known_task, "id": "x"}
    return {
        "empty": "",
        "empty object": "{}",
        "not json": "not json",
        "a JSON list": "[1,2]",
        "invalid UTF-8": b"\xff\xfe{",
        "a body that is not base64": json.dumps(
            {"body": "!!!%%%", "headers": header, "properties": {"body_encoding": "base64"}}
        ),
        "a body that is not JSON": envelope(queue, header, b"not json"),
        "a body that is no list": envelope(queue, header, b"{}"),
        "no properties": json.dumps({"body": "", "headers": {}}),
        "no delivery_info": envelope(queue, header, b"[[],{},{}]", delivery_info=None),
        "headers that are no object": envelope(queue, "oops", b"[[],{},{}]"),
        "an unknown task": task(queue, "control.no_such_task", []),
        "arguments that do not fit": task(queue, known_task, []),
        "kwargs that are a list": envelope(queue, header, b"[[], [], {}]"),
        "an eta that is no date": task(queue, known_task, ["n1", None, {}], eta="not a date"),
        "an expiry that is no date": task(queue, known_task, ["n1", None, {}], expires="never"),
        "a time limit that is no pair": task(queue, known_task, ["n1", None, {}], timelimit=5),
    }


def push(lab: Lab, queue: str, payload: bytes | str) -> None:
    import redis

    client = redis.Redis(host="127.0.0.1", port=lab.redis.port)
    try:
        client.lpush(queue, payload)
    finally:
        client.close()


def queue_length(lab: Lab, queue: str) -> int:
    argv = ["redis-cli", "-p", str(lab.redis.port), "LLEN", queue]
    done = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30)
    return int(done.stdout.strip())


def rejected(lab: Lab, reason: str) -> int:
    rows = lab.sql(
        "SELECT coalesce(sum(count), 0) FROM cluster_rejectedmessage WHERE reason = %s", reason
    )
    return int(rows[0][0])


def heartbeats_go_on(lab: Lab) -> None:
    """The agent's next heartbeat reaches the portal: both processes still work."""

    def last() -> Any:
        return lab.sql("SELECT last_heartbeat FROM cluster_node WHERE name = %s", lab.node)[0][0]

    before = last()
    lab.wait(lambda: last() != before, timeout_s=60, what="the next heartbeat to land")


def each_drop_recorded_and_the_control_worker_works(lab: Lab, cases: dict[str, Any]) -> None:
    """Each of `cases`, taken off the control queue, is shown to admins; all still runs."""
    lab.wait(
        lambda: rejected(lab, "malformed") + rejected(lab, "bad_token") >= len(cases),
        timeout_s=60,
        what=f"{len(cases)} malformed messages to be recorded",
    )
    lab.stack.check_alive()  # the control worker (and beat, and the agent) still run
    heartbeats_go_on(lab)
    assert rejected(lab, "malformed") >= len(cases) - 4  # the signed-shaped ones: bad_token


def test_the_control_worker_drops_each_malformed_message_and_keeps_working(
    start_lab: Callable[..., Lab],
) -> None:
    lab = start_lab(LABPORTAL_LIVENESS_CHECK_S="2")
    lab.start_agent(LABPORTAL_HEARTBEAT_INTERVAL="2")
    cases = payloads("control", "control.node_heartbeat")
    for payload in cases.values():
        push(lab, "control", payload)
    lab.wait(lambda: queue_length(lab, "control") == 0, timeout_s=60, what="the queue to drain")
    each_drop_recorded_and_the_control_worker_works(lab, cases)


def test_the_agent_drops_each_malformed_command_and_keeps_working(
    start_lab: Callable[..., Lab],
) -> None:
    lab = start_lab(LABPORTAL_LIVENESS_CHECK_S="2")
    lab.start_agent(LABPORTAL_HEARTBEAT_INTERVAL="2")
    queue = f"node.{lab.node}"
    cases = payloads(queue, "agent.job_logs")
    for payload in cases.values():
        push(lab, queue, payload)
    lab.wait(lambda: queue_length(lab, queue) == 0, timeout_s=60, what="the queue to drain")
    lab.stack.check_alive()  # the agent still runs
    heartbeats_go_on(lab)
    lab.stack.check_alive()

"""The wire messages' one definition (`protocol.messages`): what each side accepts and
refuses, and the docs tables generated from it. None of these tests needs Django."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from protocol import docs, messages, wire

ROOT = Path(__file__).resolve().parents[2]

SPEC: dict[str, Any] = {
    "job_id": 7,
    "image": "busybox",
    "command": ["sh", "-c", "true"],
    "env": {"A": "1"},
    "gpu_uuids": ["GPU-a"],
    "gpu_indices": [0],
    "uid": 1234,
    "gid": 2345,
    "username": "alice",
    "cpus": 1,
    "memory_mb": 64,
    "pids_limit": 64,
    "mounts": [{"source": "/data/alice", "target": "/data", "read_only": False}],
    "time_limit_s": 60,
    "attempt": 1,
    "network": "none",
}
EVENT: dict[str, Any] = {
    "event_id": "7:exited:c1",
    "job_id": 7,
    "kind": "exited",
    "ts": 1.7e9,
    "container_id": "c1",
    "exit_code": 0,
    "log_tail": "",
    "reason": "",
}


def refusal(cls: type[messages.Message], data: object) -> str:
    with pytest.raises(wire.Refused) as refused:
        wire.decode(cls, data)
    return refused.value.detail


def test_docs_agent_md_holds_the_tables_the_messages_generate() -> None:
    text = (ROOT / "docs" / "agent.md").read_text(encoding="utf-8")

    assert text == docs.render(text), "run: python -m protocol.docs docs/agent.md"
    for name in ("StartJob", "NodeInfo", "GpuReport", "Heartbeat", "JobEvent", "Sample"):
        assert f"<!-- generated: protocol.messages.{name} -->" in text


def test_a_table_lists_every_field_with_its_limits() -> None:
    table = docs.table(messages.JobEvent)

    assert [line.split("|")[1].strip() for line in table.splitlines()[2:]] == [
        f"`{name}`" for name in messages.JobEvent.__struct_fields__
    ]
    assert f"at most {messages.MAX_EVENT_ID_CHARS} characters" in table
    assert '`"started"` \\| `"exited"` \\| `"start_failed"`' in table


def test_a_start_spec_survives_the_wire_as_sent() -> None:
    spec = wire.decode(messages.StartJob, SPEC)

    assert spec.mounts == [messages.Mount(source="/data/alice", target="/data", read_only=False)]
    assert msgspec.to_builtins(spec) == {**SPEC, "cpus": 1.0, "session": None}


def test_a_session_spec_survives_the_wire_and_a_batch_job_has_none() -> None:
    spec = wire.decode(messages.StartJob, {**SPEC, "session": {"kind": "jupyter", "port": 9000}})

    assert spec.session == messages.SessionSpec(kind="jupyter", port=9000)
    assert wire.decode(messages.StartJob, {**SPEC, "session": {"kind": "terminal"}}).session == (
        messages.SessionSpec(kind="terminal", port=8888)
    )
    assert wire.decode(messages.StartJob, SPEC).session is None


@pytest.mark.parametrize(
    ("session", "detail"),
    [
        ({"kind": "vscode"}, "session kind must be one of jupyter, terminal"),
        ({"kind": "jupyter", "port": 70000}, "session port must be an integer from 1 to 65535"),
        ({"port": 8888}, "kind"),
    ],
)
def test_a_bad_session_spec_is_refused_saying_why(session: object, detail: str) -> None:
    assert detail in refusal(messages.StartJob, {**SPEC, "session": session})


def test_a_node_advertises_its_gateway_as_a_base_url() -> None:
    info = {"gpu_backend": "simulated", "runtime": "local", "gpus": []}

    assert wire.decode(messages.NodeInfo, info).gateway is None
    decoded = wire.decode(messages.NodeInfo, {**info, "gateway": "http://10.0.0.5:8765"})
    assert decoded.gateway == "http://10.0.0.5:8765"
    for bad in ("10.0.0.5:8765", "ftp://x", "http://h/path", "http://h:1 x"):
        assert "must be an http(s) base URL" in refusal(messages.NodeInfo, {**info, "gateway": bad})


def test_an_optional_field_of_the_spec_left_empty_takes_its_default() -> None:
    spec = wire.decode(messages.StartJob, {**SPEC, "env": None, "network": "", "attempt": 0})

    assert (spec.env, spec.network, spec.attempt) == ({}, "none", 0)


@pytest.mark.parametrize(
    ("overrides", "detail"),
    [
        ({"uid": 0}, "refusing to run job 7 as uid 0 gid 2345"),
        ({"job_id": True}, "'job_id' must be an integer"),
        ({"cpus": "1"}, "'cpus' must be an integer or a number"),
        ({"memory_mb": 0}, "'cpus', 'memory_mb' and 'pids_limit' must be positive"),
        ({"env": {"BAD-NAME": "x"}}, "environment variable name 'BAD-NAME' is not valid"),
        ({"mounts": ["/data"]}, "each mount must be an object with source, target, read_only"),
        ({"mounts": [{"source": "/d", "target": "/d", "read_only": 1}]}, "mount '/d': 'read_only'"),
        ({"network": "host"}, "'network' must be one of none, egress"),
    ],
)
def test_a_bad_spec_is_refused_with_the_field_and_why(
    overrides: dict[str, Any], detail: str
) -> None:
    assert refusal(messages.StartJob, {**SPEC, **overrides}).startswith(detail)


def test_an_event_as_the_agent_sends_it_decodes_and_keeps_its_keys() -> None:
    event = wire.decode(messages.JobEvent, {**EVENT, "unknown": 1})

    assert msgspec.structs.asdict(event) == EVENT


@pytest.mark.parametrize(
    ("overrides", "detail"),
    [
        ({"event_id": "e" * 161}, "event_id is longer than 160 characters"),
        ({"event_id": " "}, "event_id must be a non-empty string, got ' '"),
        ({"container_id": "c\ud800"}, "container_id contains control characters"),
        ({"ts": float("nan")}, "ts must be null or epoch seconds from 1000000000"),
        ({"job_id": 0}, "job_id must be a positive integer, got 0"),
        ({"kind": "paused"}, "kind must be one of started, exited, start_failed, got 'paused'"),
        ({"reason": 5}, "reason must be a string or null"),
    ],
)
def test_a_bad_event_is_refused_with_the_field_and_why(
    overrides: dict[str, Any], detail: str
) -> None:
    assert refusal(messages.JobEvent, {**EVENT, **overrides}).startswith(detail)


def test_a_message_that_is_not_an_object_is_refused() -> None:
    assert refusal(messages.JobEvent, [EVENT]) == "event must be an object, got list"
    assert refusal(messages.StartJob, "spec") == "the job spec must be an object"


def test_a_bad_gpu_is_set_aside_and_the_others_register() -> None:
    good = {"uuid": "GPU-a", "index": 0, "model": "H100", "memory_mb": 81559}
    mig = {**good, "uuid": "MIG-a", "kind": "mig"}
    info = {"gpu_backend": "nvml", "runtime": "docker", "gpus": [good, mig, good, "x"]}

    node, bad = wire.node_info_decode(info)

    assert [gpu.uuid for gpu in node.gpus] == ["GPU-a"]
    assert bad == [
        "gpus[1]: parent_uuid must be a non-empty string, got None",
        "gpus[2]: UUID GPU-a reported twice",
        "gpus[3]: each GPU must be an object",
    ]


def test_a_heartbeat_without_job_lists_reconciles_nothing() -> None:
    heartbeat = wire.decode(messages.Heartbeat, {"ts": 1.0, "monitor_only": True})

    assert heartbeat.running_job_ids is None and heartbeat.starting_job_ids is None
    detail = refusal(messages.Heartbeat, {"starting_job_ids": list(range(1, 10_002))})
    assert detail == "starting_job_ids must be a list of at most 10000 job ids"

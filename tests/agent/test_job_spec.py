"""Checking the portal's start_job payload before anything runs."""

from __future__ import annotations

from typing import Any

import pytest

from agent.runtime import JobSpec, MountSpec, SpecRejected
from tests.agent.support import job_spec


def test_a_valid_spec_converts_with_its_mounts() -> None:
    spec = JobSpec.from_wire(
        job_spec(
            5,
            gpu_uuids=["GPU-a", "MIG-b"],
            gpu_indices=[0, 1],
            mounts=[{"source": "/data/alice/", "target": "/data", "read_only": False}],
        ),
        allowed_mount_roots=["/data"],
    )

    assert spec.job_id == 5 and spec.uid == 1234 and spec.gid == 2345
    assert spec.mounts == [
        MountSpec(source="/data/alice", target="/data", root="/data", read_only=False)
    ]
    assert spec.visible_devices() == "GPU-a,MIG-b"


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("data/alice", "not an absolute path"),
        ("/data/../etc", "contains '..'"),
        ("/data/alice/..", "contains '..'"),
        ("/data/a:b", "forbidden character"),
        ("", "non-empty"),
    ],
)
def test_it_refuses_a_mount_source_that_could_escape(source: str, why: str) -> None:
    with pytest.raises(SpecRejected, match=why):
        JobSpec.from_wire(
            job_spec(1, mounts=[{"source": source, "target": "/data"}]), allowed_mount_roots=["/"]
        )


def test_the_operators_mount_roots_bind_whatever_the_portal_says() -> None:
    roots = ["/data", "/scratch"]
    ok = JobSpec.from_wire(
        job_spec(1, mounts=[{"source": "/scratch/alice", "target": "/s"}]),
        allowed_mount_roots=roots,
    )
    assert ok.mounts[0].read_only is True  # read-only unless the portal says otherwise

    with pytest.raises(SpecRejected, match="outside this node's allowed mount roots"):
        JobSpec.from_wire(
            # "/database" starts with "/data" but is not under it.
            job_spec(1, mounts=[{"source": "/database", "target": "/d"}]),
            allowed_mount_roots=roots,
        )


def test_a_mount_is_checked_below_the_longest_allowed_root_it_lies_under() -> None:
    spec = JobSpec.from_wire(
        job_spec(1, mounts=[{"source": "/data/shared/set", "target": "/d"}]),
        allowed_mount_roots=["/data", "/data/shared"],
    )

    assert spec.mounts[0].root == "/data/shared"


def test_a_node_without_mount_roots_allows_no_mount_at_all() -> None:
    with pytest.raises(SpecRejected, match="this node allows no mounts"):
        JobSpec.from_wire(job_spec(1, mounts=[{"source": "/etc", "target": "/host"}]))


def test_the_network_is_none_unless_the_spec_asks_for_egress() -> None:
    assert JobSpec.from_wire(job_spec(1)).network == "none"
    assert JobSpec.from_wire(job_spec(1, network="egress")).network == "egress"
    with pytest.raises(SpecRejected, match="'network' must be one of none, egress"):
        JobSpec.from_wire(job_spec(1, network="host"))


@pytest.mark.parametrize(
    ("override", "why"),
    [
        ({"uid": 0}, "non-root uid"),
        ({"gid": 0}, "non-root uid"),
        ({"job_id": True}, "'job_id' must be an integer"),
        ({"job_id": "5"}, "'job_id' must be an integer"),
        ({"command": "sleep 1"}, "'command' must be a list"),
        ({"command": ["sleep", 1]}, "list of strings"),
        ({"env": {"BAD-NAME": "x"}}, "not valid"),
        ({"env": {"A": 1}}, "map strings to strings"),
        ({"memory_mb": 0}, "must be positive"),
        ({"image": " "}, "'image' is empty"),
        ({"gpu_uuids": "GPU-a"}, "list of GPU UUID"),
    ],
)
def test_it_explains_what_is_wrong_with_a_bad_spec(override: dict[str, Any], why: str) -> None:
    data = job_spec(1)
    data.update(override)
    with pytest.raises(SpecRejected, match=why):
        JobSpec.from_wire(data)


def test_a_missing_field_is_named() -> None:
    data = job_spec(1)
    del data["pids_limit"]
    with pytest.raises(SpecRejected, match="no 'pids_limit'"):
        JobSpec.from_wire(data)

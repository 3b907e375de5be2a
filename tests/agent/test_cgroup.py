"""Mapping a host pid to its container through /proc/<pid>/cgroup."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.gpu.cgroup import container_id_for_pid, container_id_from_cgroup

CID = "3f4e1b2c" * 8  # 64 hex digits
OTHER = "a1b2c3d4" * 8


@pytest.mark.parametrize(
    "text",
    [
        # cgroup v1, docker with the cgroupfs driver
        f"12:memory:/docker/{CID}\n11:pids:/docker/{CID}\n1:name=systemd:/docker/{CID}\n",
        # cgroup v1, docker with the systemd driver
        f"4:memory:/system.slice/docker-{CID}.scope\n1:name=systemd:/system.slice/docker-{CID}.scope\n",
        # cgroup v2, docker with the systemd driver
        f"0::/system.slice/docker-{CID}.scope\n",
        # cgroup v2, docker with the cgroupfs driver
        f"0::/docker/{CID}\n",
        # cgroup v2, containerd CRI under kubelet
        "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1a2b.slice/"
        f"cri-containerd-{CID}.scope\n",
        # cgroup v1, kubelet with the cgroupfs driver
        f"9:cpu,cpuacct:/kubepods/besteffort/pod0d3c-11aa/{CID}\n",
        # podman and cri-o
        f"0::/machine.slice/libpod-{CID}.scope/container\n",
        f"0::/kubepods.slice/crio-{CID}.scope\n",
        # hybrid hierarchy: the v2 line is the root, the v1 lines name the container
        f"0::/\n5:devices:/docker/{CID}\n",
    ],
)
def test_it_finds_the_container_id_in_every_known_format(text: str) -> None:
    assert container_id_from_cgroup(text) == CID


@pytest.mark.parametrize(
    "text",
    [
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "12:memory:/\n1:name=systemd:/init.scope\n",
        "0::/system.slice/docker.service\n",
        f"0::/system.slice/docker-{CID[:12]}.scope\n",  # a short id is not a container id
        "",
        "garbage without colons\n",
    ],
)
def test_a_process_outside_any_container_has_none(text: str) -> None:
    assert container_id_from_cgroup(text) is None


def test_nested_containers_resolve_to_the_outermost_one_the_host_engine_knows() -> None:
    assert container_id_from_cgroup(f"0::/docker/{CID}/docker/{OTHER}\n") == CID


def test_it_reads_the_pid_file_and_tolerates_a_vanished_process(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(f"0::/system.slice/docker-{CID}.scope\n")

    assert container_id_for_pid(4242, tmp_path) == CID
    assert container_id_for_pid(4243, tmp_path) is None

"""Job folders: the agent checks and makes them, a local job writes there, the portal reads it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.runtime import JobSpec, RuntimeStartError
from agent.runtime.base import SpecRejected
from agent.runtime.docker_runtime import DockerRuntime
from agent.runtime.job_dirs import job_dir_mount
from agent.runtime.local import LocalProcessRuntime
from files import paths
from tests.agent.support import job_spec, wait_until


def spec_with_folder(root: Path, job_id: int = 7, **overrides: object) -> JobSpec:
    payload = job_spec(job_id, job_dir=str(root / "alice" / str(job_id)), **overrides)
    return JobSpec.from_wire(payload, job_dir_root=str(root))


def test_a_local_job_runs_in_its_folder_and_the_portal_lists_and_reads_what_it_wrote(
    tmp_path: Path,
) -> None:
    root = tmp_path / "jobs"
    root.mkdir()
    runtime = LocalProcessRuntime(tmp_path / "state", enabled=True)
    spec = spec_with_folder(
        root, command=["sh", "-c", 'echo "loss 0.1" > out.txt; echo "$LABPORTAL_JOB_DIR" > where']
    )
    runtime.start(spec)
    folder = root / "alice" / "7"
    wait_until(lambda: (folder / "where").exists() and (folder / "where").read_text())
    assert (folder / "where").read_text().strip() == str(folder)
    if os.geteuid() == 0:
        assert (folder.stat().st_uid, folder.stat().st_gid) == (1234, 2345)
        assert (folder.parent.stat().st_uid, folder.stat().st_mode & 0o777) == (1234, 0o750)
    listing = paths.list_folder(str(root), ("alice", "7"), ())
    assert {e.name for e in listing.entries} == {"out.txt", "where"}
    handle, size = paths.open_file(str(root), ("alice", "7"), ("out.txt",))
    with handle:
        assert handle.read() == b"loss 0.1\n" and size == 9


def test_a_folder_outside_the_nodes_root_or_not_the_jobs_own_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "jobs"
    with pytest.raises(SpecRejected, match="must lie under this node's --job-dir-root"):
        JobSpec.from_wire(job_spec(7, job_dir="/etc/alice/7"), job_dir_root=str(root))
    with pytest.raises(SpecRejected, match="end in /<username>/<job id>"):
        JobSpec.from_wire(job_spec(7, job_dir=f"{root}/bob/7"), job_dir_root=str(root))
    with pytest.raises(SpecRejected, match="contains '..'"):
        JobSpec.from_wire(job_spec(7, job_dir=f"{root}/../alice/7"), job_dir_root=str(root))
    with pytest.raises(SpecRejected, match="this node has no job folders"):
        JobSpec.from_wire(job_spec(7, job_dir=f"{root}/alice/7"))
    assert JobSpec.from_wire(job_spec(7)).job_dir == ""


def test_a_symlinked_member_folder_is_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "jobs"
    elsewhere = tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (root / "alice").symlink_to(elsewhere)
    runtime = LocalProcessRuntime(tmp_path / "state", enabled=True)
    with pytest.raises(RuntimeStartError, match="not a real folder"):
        runtime.start(spec_with_folder(root, command=["true"]))
    assert list(elsewhere.iterdir()) == []
    assert runtime.list_jobs() == []


def test_a_container_mounts_its_folder_read_write_at_job_and_works_there(tmp_path: Path) -> None:
    root = tmp_path / "jobs"
    spec = spec_with_folder(root)
    mount = job_dir_mount(spec)
    assert mount is not None and (mount.target, mount.read_only) == ("/job", False)
    runtime = DockerRuntime.__new__(DockerRuntime)
    runtime._node, runtime._use_init, runtime._gpu_device_requests = "gpu01", True, False
    runtime._ncpu = 64  # no engine here to ask
    kwargs = runtime.create_kwargs(spec, [])
    assert kwargs["working_dir"] == "/job"
    assert kwargs["environment"]["LABPORTAL_JOB_DIR"] == "/job"
    assert "working_dir" not in runtime.create_kwargs(JobSpec.from_wire(job_spec(8)), [])

"""A Docker job works in its own folder: made by the agent, mounted read-write at /job."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.runtime import JobSpec
from agent.runtime.docker_runtime import DockerRuntime
from tests.agent.support import job_spec, wait_until

pytestmark = pytest.mark.docker


def test_a_container_job_writes_in_its_folder_at_job_as_the_member(
    docker_runtime: DockerRuntime, tmp_path: Path
) -> None:
    root = tmp_path / "jobs"
    root.mkdir()
    folder = root / "alice" / "120"
    docker_runtime.start(
        JobSpec.from_wire(
            job_spec(
                120,
                command=["sh", "-c", 'pwd > where; echo "$LABPORTAL_JOB_DIR" >> where'],
                job_dir=str(folder),
            ),
            job_dir_root=str(root),
        )
    )
    wait_until(
        lambda: (folder / "where").exists() and (folder / "where").read_text().count("\n") == 2
    )

    assert (folder / "where").read_text() == "/job\n/job\n"
    stat = (folder / "where").stat()
    assert (stat.st_uid, stat.st_gid) == (1234, 2345)

"""Issue 25: a member's job escaped the mount allowlist through a symlink.

With the mounts ``data=<srv>/{username}`` and ``scratch=<srv>/{username}/scratch``,
a job of alice's replaced ``scratch`` (inside her data mount) with a symlink to
bob's directory, then to ``/``. Docker follows symlinks in a bind mount's source,
so her next job read bob's files, the host's ``/etc/passwd`` and a world-readable
token file, and created a file on the host. Replayed here with real containers.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from docker.models.containers import ContainerCollection

from agent.node import NodeAgent
from agent.runtime.docker_runtime import DockerRuntime
from tests.agent.support import RecordingApp, job_spec, make_agent, wait_until

pytestmark = pytest.mark.docker

# Alice's jobs run as the uid that owns her directories: job_spec's member where
# the test may chown them to it (as root), else the test's own (never root).
ALICE_UID, ALICE_GID = (1234, 2345) if os.geteuid() == 0 else (os.getuid(), os.getgid())
BOBS_SECRET = "bob-secret-7d1c"
TOKEN = "lpn_host-token-51f0"


@dataclass
class Host:
    """The node's files: an allowed root with alice's and bob's directories, and the host's."""

    root: Path
    srv: Path
    token: Path
    world_writable: Path

    @property
    def scratch(self) -> Path:
        return self.srv / "alice" / "scratch"

    def mounts(self, *names: str) -> list[dict[str, Any]]:
        """Alice's mounts as the portal sends them: the admin's templates, resolved for her."""
        templates = {
            "data": f"{self.srv}/{{username}}",
            "scratch": f"{self.srv}/{{username}}/scratch",
        }
        return [
            {
                "source": templates[n].replace("{username}", "alice"),
                "target": f"/{n}",
                "read_only": False,
            }
            for n in names
        ]


@pytest.fixture
def host() -> Iterator[Host]:
    # Under /tmp rather than tmp_path: through a symlink to / the job walks the
    # host's own tree as alice, and pytest's base directory is private to root.
    root = Path(tempfile.mkdtemp(prefix="labportal-mount-escape-"))
    root.chmod(0o755)
    srv = root / "srv"
    (srv / "bob").mkdir(parents=True)
    (srv / "bob" / "secret.txt").write_text(BOBS_SECRET)
    (srv / "alice" / "scratch").mkdir(parents=True)
    for mine in (srv / "alice", srv / "alice" / "scratch"):
        if os.geteuid() == 0:
            os.chown(mine, ALICE_UID, ALICE_GID)
    token = root / "node-token"
    token.write_text(TOKEN)
    token.chmod(0o644)
    world_writable = root / "shared-tmp"
    world_writable.mkdir()
    world_writable.chmod(0o1777)
    yield Host(root=root, srv=srv, token=token, world_writable=world_writable)
    shutil.rmtree(root)


def alices_job(job_id: int, mounts: list[dict[str, Any]], command: list[str]) -> dict[str, Any]:
    return job_spec(job_id, uid=ALICE_UID, gid=ALICE_GID, mounts=mounts, command=command)


def run_job(
    node_agent: NodeAgent,
    runtime: DockerRuntime,
    job_id: int,
    mounts: list[dict[str, Any]],
    script: str,
) -> str | None:
    """Start a job of alice's through the agent; its output once it ended, or None if refused."""
    node_agent.start_job(
        alices_job(job_id, mounts, ["sh", "-c", script]), delivery_id=f"d-{job_id}"
    )
    if runtime.job_status(job_id) is None:
        return None
    wait_until(lambda: not runtime.job_status(job_id).running)  # type: ignore[union-attr]
    return runtime.logs(job_id, 50)


def refusal(app: RecordingApp, job_id: int) -> str:
    (event,) = [e for e in app.events("start_failed") if e["job_id"] == job_id]
    return str(event["reason"])


def test_a_scratch_mount_replaced_by_a_symlink_to_bob_and_then_to_root_is_refused(
    docker_runtime: DockerRuntime, node_name: str, host: Host, caplog: pytest.LogCaptureFixture
) -> None:
    node_agent, app = make_agent(docker_runtime, node_name, allowed_mount_roots=[str(host.srv)])

    # Alice's first job, with both mounts, points her scratch at bob's directory.
    first = run_job(
        node_agent,
        docker_runtime,
        1,
        host.mounts("data", "scratch"),
        f"rm -rf /data/scratch && ln -s {host.srv}/bob /data/scratch && echo SWAPPED",
    )
    assert first is not None and "SWAPPED" in first and host.scratch.is_symlink()

    to_bob = run_job(
        node_agent,
        docker_runtime,
        2,
        host.mounts("data", "scratch"),
        "cat /scratch/secret.txt; echo DONE",
    )

    assert to_bob is None or BOBS_SECRET not in to_bob
    reason = refusal(app, 2)
    assert f"{host.scratch} is a symlink (to {host.srv}/bob)" in reason
    assert docker_runtime.job_status(2) is None  # no container was created
    assert any("job 2 failed to start" in r.getMessage() for r in caplog.records)

    # A job with only her data mount still runs, and points scratch at the host's root.
    repoint = run_job(
        node_agent,
        docker_runtime,
        3,
        host.mounts("data"),
        "rm /data/scratch && ln -s / /data/scratch && echo SWAPPED",
    )
    assert repoint is not None and "SWAPPED" in repoint

    planted = host.world_writable / "planted-by-alice"
    to_root = run_job(
        node_agent,
        docker_runtime,
        4,
        host.mounts("data", "scratch"),
        f"cat /scratch/etc/passwd /scratch{host.token}; touch /scratch{planted}; echo DONE",
    )

    assert to_root is None or ("root:x:0:0" not in to_root and TOKEN not in to_root)
    assert not planted.exists()
    assert f"{host.scratch} is a symlink (to /)" in refusal(app, 4)
    assert docker_runtime.job_status(4) is None


def test_a_scratch_swapped_for_a_symlink_between_the_check_and_the_start_is_caught(
    docker_runtime: DockerRuntime,
    node_name: str,
    host: Host,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine mounts at the start, after the agent's check: a running job can race it."""
    node_agent, app = make_agent(docker_runtime, node_name, allowed_mount_roots=[str(host.srv)])
    create = ContainerCollection.create

    def swap_then_create(self: ContainerCollection, *args: Any, **kwargs: Any) -> Any:
        host.scratch.rmdir()
        host.scratch.symlink_to(host.srv / "bob")
        return create(self, *args, **kwargs)

    monkeypatch.setattr(ContainerCollection, "create", swap_then_create)

    node_agent.start_job(
        alices_job(5, host.mounts("data", "scratch"), ["sh", "-c", "sleep 30"]),
        delivery_id="d-5",
    )

    reason = refusal(app, 5)
    assert "changed after it was checked" in reason and "/scratch" in reason
    assert docker_runtime.job_status(5) is None  # the container was removed
    assert not app.events("started")

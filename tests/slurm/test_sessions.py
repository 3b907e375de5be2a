"""Slurm mode: a JupyterLab session is a batch job that starts the server on its node (as
Open OnDemand's interactive apps do) and the portal's proxy reaches it, with the token the
member never sees; a terminal session is refused with what to do instead."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from jobqueue.models import Job
from sessions import launch, proxy
from sessions.status import session_status
from slurm.models import SlurmJob, UnixLogin
from tests.conftest import api_as
from tests.sessions.test_proxy import cookie_for, http, run
from tests.slurm.test_slurm_mode import BUSYBOX, body, slurm_lab, synced_until

__all__ = ["slurm_lab"]  # a fixture
pytestmark = [pytest.mark.slurm, pytest.mark.django_db(transaction=True)]
VENV_BIN = Path(settings.BASE_DIR) / ".venv" / "bin"


@pytest.fixture
def jupyter_for_members() -> Iterator[Path]:
    """This checkout's jupyter, runnable by the members' unix users for the test: a
    directory above the venv's interpreter that others may not enter (a Python installed
    under /root, mode 700) gets o+x (enter, not list) until the test ends."""
    jupyter = VENV_BIN / "jupyter"
    assert jupyter.exists(), jupyter
    opened: list[tuple[Path, int]] = []
    for target in (jupyter, Path(os.path.realpath(VENV_BIN / "python"))):
        for folder in reversed(target.parents):
            mode = folder.stat().st_mode
            if not mode & stat.S_IXOTH and folder not in dict(opened):
                folder.chmod(mode | stat.S_IXOTH)
                opened.append((folder, mode))
    try:
        yield jupyter
    finally:
        for folder, mode in reversed(opened):
            folder.chmod(stat.S_IMODE(mode))


def start(user: Any, kind: str) -> Any:
    """A session of ``kind`` that fits the private Slurm's small node."""
    session = {"kind": kind, "image": BUSYBOX, "queue": "debug", "gpus": 1}
    return api_as(user).post(
        "/api/sessions/", {**session, "cpus": 1, "memory_mb": 256}, format="json"
    )


def test_a_jupyter_session_runs_as_a_batch_job_and_the_proxy_reaches_its_server(
    slurm_lab: Any,
    alice: Any,
    bob: Any,
    monkeypatch: pytest.MonkeyPatch,
    jupyter_for_members: Path,
) -> None:
    # The node's jupyter is this checkout's (the member's batch job has only a plain PATH).
    jupyter = jupyter_for_members
    monkeypatch.setattr(
        launch,
        "JUPYTER_COMMAND",
        launch.JUPYTER_COMMAND.replace("exec jupyter lab", f"exec {jupyter} lab"),
    )
    response = start(alice, "jupyter")
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=body(response)["job"]["id"])
    record = SlurmJob.objects.get(job=job)
    assert job.kind == Job.Kind.JUPYTER and "jupyter" in " ".join(job.command)

    synced_until(lambda: Job.objects.get(pk=job.pk).state == Job.State.RUNNING, "it runs")
    job.refresh_from_db()
    synced_until(lambda: session_status(job, username="test").ready, "its server answers", 120)
    output = Path(record.output_path).read_text()
    assert output.startswith("LABPORTAL-SESSION host=")
    # The token reached the job's environment, never its output or the member's API.
    token = launch.session_token(job_id=job.pk, attempt=job.dispatch_count)
    assert token not in output and token not in json.dumps(body(response))

    async def through_the_proxy(cookie: str) -> tuple[int, bytes]:
        try:
            status, _headers, content = await http(f"/sessions/{job.pk}/api/status", cookie=cookie)
        finally:
            await proxy.client.close()
        return status, content

    status, content = run(through_the_proxy(cookie_for(alice)))
    assert status == 200, content
    assert {"started", "last_activity", "kernels"} <= set(json.loads(content))
    assert run(through_the_proxy(cookie_for(bob)))[0] == 403
    assert session_status(job, username="test").last_activity is not None

    answer = api_as(alice).get(f"/api/sessions/{job.pk}/")
    assert body(answer)["ready"] is True


def test_a_terminal_session_is_refused_with_what_to_do_instead(slurm_lab: Any, alice: Any) -> None:
    response = start(alice, "terminal")
    assert response.status_code == 400, response.content
    assert "File → New → Terminal" in response.content.decode()
    assert not Job.objects.filter(owner=alice).exists()
    assert UnixLogin.objects.filter(user=alice).exists()  # refused for the kind, not the login

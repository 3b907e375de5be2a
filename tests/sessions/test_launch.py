"""A session is a job with a kind: its command, its token and StartJob.session for the agent."""

from __future__ import annotations

from typing import Any

import pytest

from jobqueue.errors import JobRefused
from jobqueue.models import Job
from scheduling.dispatch import start_spec
from sessions.launch import session_token
from sessions.services import session_start

pytestmark = pytest.mark.django_db


def test_a_jupyter_session_starts_jupyterlab_under_its_portal_path(
    cluster: Any, alice: Any, image: Any
) -> None:
    job = session_start(owner=alice, kind="jupyter", image=image.reference, queue="normal")
    assert job.kind == Job.Kind.JUPYTER and job.state == Job.State.PENDING
    script = job.command[-1]
    assert "jupyter lab" in script
    assert '--ServerApp.base_url="/sessions/$LABPORTAL_JOB_ID/"' in script
    assert '--ip="$LABPORTAL_SESSION_HOST" --port="$LABPORTAL_SESSION_PORT"' in script
    # The token is never an argument (ps would show it) nor stored on the job.
    assert 'JUPYTER_TOKEN="$LABPORTAL_SESSION_TOKEN"' in script
    assert "LABPORTAL_SESSION_TOKEN" not in job.env


def test_the_dispatch_gives_a_session_its_spec_and_token(
    cluster: Any, alice: Any, image: Any
) -> None:
    job = session_start(owner=alice, kind="jupyter", image=image.reference, queue="normal")
    job.dispatch_count = 2
    spec = start_spec(job, [])
    assert spec["session"] == {"kind": "jupyter", "port": 8888}
    assert spec["env"]["LABPORTAL_SESSION_TOKEN"] == session_token(job_id=job.pk, attempt=2)
    assert spec["env"]["LABPORTAL_JOB_ID"] == str(job.pk)


def test_a_terminal_session_keeps_its_container_alive(cluster: Any, alice: Any, image: Any) -> None:
    job = session_start(owner=alice, kind="terminal", image=image.reference, queue="normal")
    assert job.command == ["/bin/sh", "-c", "exec sleep infinity"]
    assert start_spec(job, [])["session"] == {"kind": "terminal", "port": 8888}


def test_a_batch_job_gets_no_session(cluster: Any, alice: Any, image: Any) -> None:
    from jobqueue.submit import job_submit

    job = job_submit(owner=alice, queue="normal", image=image.reference, command="true")
    spec = start_spec(job, [])
    assert spec["session"] is None and "LABPORTAL_SESSION_TOKEN" not in spec["env"]


def test_the_token_is_derived_per_job_and_attempt() -> None:
    assert session_token(job_id=1, attempt=1) == session_token(job_id=1, attempt=1)
    assert session_token(job_id=1, attempt=1) != session_token(job_id=1, attempt=2)
    assert session_token(job_id=1, attempt=1) != session_token(job_id=2, attempt=1)


def test_an_unknown_kind_is_refused(cluster: Any, alice: Any, image: Any) -> None:
    with pytest.raises(JobRefused):
        session_start(owner=alice, kind="vscode", image=image.reference)


def test_a_session_goes_through_the_queues_limits(cluster: Any, alice: Any, image: Any) -> None:
    from jobqueue.errors import TooManyGpus

    with pytest.raises(TooManyGpus):
        session_start(owner=alice, kind="jupyter", image=image.reference, queue="debug", gpus=64)


def test_jupyters_runtime_folder_is_a_fresh_one_where_the_job_ids_folder_is_taken(
    tmp_path: Any,
) -> None:
    """The local-process runtime shares /tmp: a folder for this job id left by another uid
    (another database's job 5) must not stop the server."""
    import os
    import stat
    import subprocess

    from sessions.launch import JUPYTER_COMMAND

    taken = tmp_path / "jupyter-5"
    taken.mkdir(mode=0o500)
    prefix = JUPYTER_COMMAND.split("exec jupyter")[0]
    shown = subprocess.run(
        ["/bin/sh", "-c", prefix + 'echo "$JUPYTER_RUNTIME_DIR"'],
        env={"PATH": os.environ["PATH"], "TMPDIR": str(tmp_path), "LABPORTAL_JOB_ID": "5"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    runtime = tmp_path / os.path.basename(shown)
    assert runtime.parent == tmp_path and runtime != taken and runtime.name.startswith("jupyter-5.")
    assert runtime.is_dir() and not any(runtime.iterdir())
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o700

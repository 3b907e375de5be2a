"""What a session runs: its command, its secret token and the agent's `StartJob.session`.

The command is stored on the job at submit (the job page shows it); it reads the
job's id, the address to listen on and the token from the environment, which the
agent and the dispatch fill in. The token is derived from SECRET_KEY, the job and
its attempt with an HMAC, so it is never stored and never leaves the portal: the
proxy adds it to each request it sends upstream (`Authorization: token ...`).
"""

from __future__ import annotations

from typing import Literal, cast

from django.utils.crypto import salted_hmac

from protocol.messages import SessionSpec

SESSION_KINDS = ("jupyter", "terminal")
JUPYTER_PORT = 8888
TOKEN_ENV = "LABPORTAL_SESSION_TOKEN"

JUPYTER_COMMAND = (
    # The token goes in the environment (JUPYTER_TOKEN), not the arguments that ps shows.
    # The runtime folder is a fresh one of the job's own (mktemp -d, mode 0700): the
    # local-process runtime shares /tmp, where a job id's folder may be left by a job of
    # another uid (another lab's database, an earlier install) and Jupyter would fail.
    'export HOME="${HOME:-/tmp}" JUPYTER_TOKEN="$LABPORTAL_SESSION_TOKEN" '
    'JUPYTER_RUNTIME_DIR="$(mktemp -d "${TMPDIR:-/tmp}/jupyter-$LABPORTAL_JOB_ID.XXXXXX")"; '
    # Notebooks are saved where the member can write: the job's folder if it has one, else
    # the working directory, else HOME (a container's root filesystem is read-only).
    'cd "${LABPORTAL_JOB_DIR:-.}" 2>/dev/null; [ -w . ] || cd "$HOME"; '
    "exec jupyter lab --no-browser "
    '--ip="$LABPORTAL_SESSION_HOST" --port="$LABPORTAL_SESSION_PORT" '
    '--ServerApp.base_url="/sessions/$LABPORTAL_JOB_ID/" '
    "--ServerApp.allow_remote_access=True --ServerApp.port_retries=0"
)
# A terminal session only keeps its container alive: the terminal is an exec into it.
TERMINAL_COMMAND = "exec sleep infinity"


def session_command(kind: str) -> list[str]:
    """The argument vector a session of ``kind`` runs."""
    return ["/bin/sh", "-c", JUPYTER_COMMAND if kind == "jupyter" else TERMINAL_COMMAND]


def session_token(*, job_id: int, attempt: int) -> str:
    """The secret the job's server accepts; the same value in every portal process."""
    return salted_hmac("labportal.sessions.token", f"{job_id}:{attempt}").hexdigest()


def session_dispatch(
    *, job_id: int, attempt: int, kind: str
) -> tuple[dict[str, str], SessionSpec | None]:
    """The environment and `StartJob.session` for a job of ``kind``; nothing for a batch job."""
    if kind not in SESSION_KINDS:
        return {}, None
    env = {TOKEN_ENV: session_token(job_id=job_id, attempt=attempt)}
    spec_kind = cast(Literal["jupyter", "terminal"], kind)
    return env, SessionSpec(kind=spec_kind, port=JUPYTER_PORT)

"""Each job's working folder on the lab's shared storage: ``<--job-dir-root>/<user>/<job id>``.

The agent makes it just before the start, walking from the operator's root one component
at a time without following symlinks (as ``mount_paths`` does for mounts), and gives the
member's folder and the job's folder to the job's uid and gid. The portal's file browser
reads the same folder on the same shared storage.
"""

from __future__ import annotations

import logging
import os
from pathlib import PurePosixPath

from agent.runtime.base import JobSpec, MountSpec
from agent.runtime.mount_paths import MountRefused

log = logging.getLogger(__name__)

CONTAINER_JOB_DIR = "/job"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# The member's folder and the job's: not for the other members on the shared storage.
_MODE = 0o750


def job_dir_mount(spec: JobSpec) -> MountSpec | None:
    """The job folder as a read-write mount at /job; None for a job without one."""
    if not spec.job_dir:
        return None
    return MountSpec(
        source=spec.job_dir, target=CONTAINER_JOB_DIR, root=spec.job_dir_root, read_only=False
    )


def prepare_job_dir(spec: JobSpec) -> str:
    """Make the job's folder if missing and return its real path; raise ``MountRefused``."""
    root = os.path.realpath(spec.job_dir_root)
    parts = PurePosixPath(spec.job_dir).relative_to(spec.job_dir_root).parts
    # The folders the member owns: <user> and <user>/<job id>; above them, the operator's.
    owned_from = len(parts) - 2
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError as exc:
        raise MountRefused(
            f"job folder {spec.job_dir!r}: the node's --job-dir-root {spec.job_dir_root} "
            f"cannot be opened ({exc.strerror})"
        ) from exc
    path = root
    try:
        for index, part in enumerate(parts):
            path = os.path.join(path, part)
            made = False
            try:
                os.mkdir(part, _MODE if index >= owned_from else 0o755, dir_fd=fd)
                made = True
            except FileExistsError:
                pass
            except OSError as exc:
                raise MountRefused(
                    f"job folder {spec.job_dir!r}: {path} cannot be made ({exc.strerror})"
                ) from exc
            try:
                next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise MountRefused(
                    f"job folder {spec.job_dir!r}: {path} is not a real folder (a symlink or "
                    f"a file?): {exc.strerror}"
                ) from exc
            os.close(fd)
            fd = next_fd
            if made and index >= owned_from:
                _give_to_job_user(fd, spec, path)
    finally:
        os.close(fd)
    return path


def _give_to_job_user(fd: int, spec: JobSpec, path: str) -> None:
    if os.geteuid() != 0:
        # An agent that is not root cannot give it away: the folder stays the agent's
        # user's (the demo's local runtime runs jobs as that user anyway).
        log.info("job folder %s stays owned by the agent's user (not root)", path)
        return
    os.fchown(fd, spec.uid, spec.gid)
    os.fchmod(fd, _MODE)

"""Mount sources by their real path, so that a bind mount shows a job only what it was allowed.

Docker follows symlinks in a bind mount's source, and a member can replace any
directory she may write (inside her own data mount, say) with a symlink to
another member's directory or to ``/``. So a source is opened one component at
a time below its allowed root, never following a symlink, and refused if any
component is one. The root itself is the operator's and is taken by its real
path. Docker gets the real path that was checked.

The engine mounts the source later, when the container starts, and a running
job could swap a component in between. So after the start the agent reads the
container's mount table and checks that each mount shows the directory it
checked (same filesystem, same place in it); if not, the container is removed.
That stops such a job within milliseconds, not before it ran: Docker offers no
way to mount a path that was opened and checked. A job that has already ended
by then is only logged, since it ran and may have changed its own directories.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from agent.gpu.cgroup import container_id_for_pid
from agent.runtime.base import MountSpec, RuntimeStartError


class MountRefused(RuntimeStartError):
    """A mount source leads somewhere other than the directory its allowlist names."""


@dataclass(frozen=True)
class CheckedSource:
    """A mount source as checked: its real path and what the kernel knows it by."""

    mount: MountSpec
    real_path: str
    device_inode: tuple[int, int]
    # (major:minor, path within that filesystem): the pair a mount table shows.
    filesystem_place: tuple[str, str]


def checked_source(mount: MountSpec) -> CheckedSource:
    """Walk ``mount.source`` below its root without following symlinks; raise ``MountRefused``."""
    root = os.path.realpath(mount.root)
    parts = PurePosixPath(mount.source).relative_to(mount.root).parts
    try:
        fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    except OSError as exc:
        raise MountRefused(
            f"mount source {mount.source!r} refused: its allowed root {mount.root} cannot be "
            f"opened on this node ({exc.strerror})"
        ) from exc
    path = root
    try:
        for part in parts:
            parent, path = fd, posixpath.join(path, part)
            try:
                fd = os.open(part, os.O_PATH | os.O_NOFOLLOW, dir_fd=parent)
            except OSError as exc:
                os.close(parent)
                fd = -1
                raise MountRefused(
                    f"mount source {mount.source!r} refused: {path} cannot be opened "
                    f"({exc.strerror})"
                ) from exc
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                try:
                    target = os.readlink(part, dir_fd=parent)
                except OSError:  # swapped again meanwhile
                    target = "?"
                os.close(parent)
                raise MountRefused(
                    f"mount source {mount.source!r} refused: {path} is a symlink (to {target}). "
                    f"Below {mount.root}, a mount source and every directory on the way to it "
                    "must be real directories; replace the symlink with a directory"
                )
            os.close(parent)
        info = os.fstat(fd)
    finally:
        if fd >= 0:
            os.close(fd)
    if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
        raise MountRefused(
            f"mount source {mount.source!r} refused: it is neither a directory nor a file"
        )
    return CheckedSource(
        mount=mount,
        real_path=path,
        device_inode=(info.st_dev, info.st_ino),
        filesystem_place=_filesystem_place(path),
    )


def mounts_not_as_checked(
    pid: int, container_id: str, checked: Sequence[CheckedSource]
) -> list[str] | None:
    """What differs between the mounts of container ``container_id`` (host process ``pid``)
    and ``checked``, one line each; ``None`` if its mount table cannot be read.

    It cannot once the container has ended (a job may end within milliseconds),
    nor where the agent sees other pids than the engine (an agent in a container).
    """
    if pid <= 0 or container_id_for_pid(pid) != container_id:
        return None
    try:
        table = _mount_table(f"/proc/{pid}/mountinfo")
    except OSError:
        return None
    if not table:  # the process was exiting: its mount namespace is gone
        return None
    problems = []
    for source in checked:
        shown = [(dev, place) for dev, place, point in table if point == source.mount.target]
        if not shown:
            # The engine mounts below a symlink of the image at the link's target.
            problems.append(
                f"{source.mount.target} is not a mount point in the container (is it a "
                "symlink in the image?)"
            )
        # A directory the job removed since is shown as "<its place>//deleted".
        elif _undeleted(shown[-1]) != source.filesystem_place:
            problems.append(
                f"{source.mount.source} changed after it was checked: {source.mount.target} "
                f"in the container does not show {source.real_path}"
            )
    return problems


def _undeleted(place: tuple[str, str]) -> tuple[str, str]:
    dev, path = place
    return dev, path.removesuffix("//deleted")


def sources_changed_since_checked(checked: Sequence[CheckedSource]) -> list[str]:
    """The sources that no longer lead to the directory they led to when checked."""
    changed = []
    for source in checked:
        try:
            same = checked_source(source.mount).device_inode == source.device_inode
        except MountRefused as exc:
            changed.append(str(exc))
            continue
        if not same:
            changed.append(f"{source.mount.source} is no longer the directory that was checked")
    return changed


def _filesystem_place(path: str) -> tuple[str, str]:
    """The mount table's (major:minor, root) that a bind mount of ``path`` would show."""
    best: tuple[str, str, str] | None = None
    for dev, root, point in _mount_table("/proc/self/mountinfo"):
        covers = point == "/" or path == point or path.startswith(point + "/")
        # Later lines are mounted over earlier ones at the same point.
        if covers and (best is None or len(point) >= len(best[2])):
            best = (dev, root, point)
    if best is None:  # /proc/self/mountinfo always has "/"; this is only for the type checker
        raise MountRefused(f"no mount covers {path} in this agent's mount table")
    dev, root, point = best
    inside = posixpath.relpath(path, point)
    return dev, posixpath.normpath(posixpath.join(root, inside)) if inside != "." else root


_ESCAPE = re.compile(r"\\([0-7]{3})")


def _mount_table(mountinfo: str) -> list[tuple[str, str, str]]:
    """(major:minor, root, mount point) of each line of a ``/proc/PID/mountinfo``."""
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as lines:
        rows = [line.split(" ") for line in lines]
    return [(row[2], _unescape(row[3]), _unescape(row[4])) for row in rows if len(row) > 4]


def _unescape(field: str) -> str:
    # The kernel writes space, tab, newline and backslash as octal escapes.
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)

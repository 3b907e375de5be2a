"""Reading and writing below a place's root by real path, as the portal's own process.

The rules are those of the agent's mounts (``agent/runtime/mount_paths.py``): a path is
walked one component at a time from the operator's root, opened with ``O_NOFOLLOW``, so
no symlink is ever followed, whoever made it; ``..``, absolute paths and NUL are refused
before anything is opened; only folders and regular files are shown, read or written,
never devices or FIFOs. A file is checked by ``lstat`` and then opened and checked
again (same inode), so a swap in between is refused instead of followed. Writes go to a
hidden temporary file in the same folder and are linked into place, which never follows
a symlink either.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import BinaryIO

from django.utils.translation import gettext as _

from files.errors import AlreadyExists, FileNotFound, PathRefused, UploadTooLarge

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_PATH_CHARS = 4096
MAX_NAME_BYTES = 255
# A folder with more entries is listed up to this many (the listing says so).
MAX_LISTED = 5000


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str  # "folder", "file", "symlink" (shown, never followed) or "other"
    size: int | None
    modified: float


@dataclass(frozen=True)
class Listing:
    entries: list[Entry]
    truncated: bool


def clean_parts(path: str) -> tuple[str, ...]:
    """The components of a path inside a place; raise ``PathRefused`` for what may lead out."""
    if "\x00" in path:
        raise PathRefused(_("The path contains a NUL character, which no file name may."))
    if len(path) > MAX_PATH_CHARS:
        raise PathRefused(
            _("The path is longer than %(max)d characters.") % {"max": MAX_PATH_CHARS}
        )
    if path.startswith("/"):
        raise PathRefused(
            _(
                "Absolute paths are refused: give the path inside the volume or the job's "
                "folder, e.g. “results/out.txt”, not “%(path)s”."
            )
            % {"path": path}
        )
    parts = tuple(part for part in path.split("/") if part not in ("", "."))
    if ".." in parts:
        raise PathRefused(
            _("“..” is refused in a path: give the path from the top of the volume or folder.")
        )
    return parts


def clean_name(name: str) -> str:
    """One file or folder name, as given for an upload or a new folder."""
    if not name or name in (".", "..") or "/" in name or "\x00" in name:
        raise PathRefused(
            _("“%(name)s” cannot be a file or folder name: no “/”, and not “.” or “..”.")
            % {"name": name}
        )
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        raise PathRefused(
            _("The name is longer than %(max)d bytes; shorten it.") % {"max": MAX_NAME_BYTES}
        )
    return name


def _shown(parts: Sequence[str]) -> str:
    return "/".join(parts) or "/"


def _refusal(exc: OSError, parent_fd: int, part: str, shown: str) -> Exception:
    """What an ``openat`` that failed on ``part`` means for the member."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        try:
            info = os.stat(part, dir_fd=parent_fd, follow_symlinks=False)
        except OSError:
            info = None
        if info is not None and stat.S_ISLNK(info.st_mode):
            return PathRefused(
                _(
                    "“%(path)s” is a symlink. The file browser follows no symlinks, so "
                    "that nothing leads out of your volume or job folder; open the real "
                    "folder instead."
                )
                % {"path": shown}
            )
        return PathRefused(_("“%(path)s” is not a folder.") % {"path": shown})
    if exc.errno == errno.ENOENT:
        return FileNotFound(_("“%(path)s” does not exist.") % {"path": shown})
    if exc.errno in (errno.EACCES, errno.EPERM):
        return PathRefused(
            _("The portal may not read “%(path)s” (permission denied on the shared storage).")
            % {"path": shown}
        )
    return PathRefused(
        _("“%(path)s” cannot be opened (%(reason)s).") % {"path": shown, "reason": exc.strerror}
    )


@contextmanager
def opened_folder(root: str, inner: Sequence[str], parts: Sequence[str]) -> Iterator[int]:
    """A file descriptor of the folder ``root/inner/parts``, walked without following links.

    ``root`` is the operator's (taken by its real path); ``inner`` leads from it to the
    place's top, ``parts`` from there to the folder. Errors name ``parts`` only.
    """
    fd = os.open(os.path.realpath(root), _DIR_FLAGS)
    try:
        walked: list[str] = []
        for index, part in enumerate((*inner, *parts)):
            if index >= len(inner):
                walked.append(part)
            try:
                next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if index < len(inner) and exc.errno == errno.ENOENT:
                    raise FileNotFound(_("This folder does not exist yet.")) from None
                raise _refusal(exc, fd, part, _shown(walked or [part])) from None
            os.close(fd)
            fd = next_fd
        yield fd
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def list_folder(root: str, inner: Sequence[str], parts: Sequence[str]) -> Listing:
    """The folder's entries, folders first, then by name; symlinks are shown, not followed."""
    entries: list[Entry] = []
    truncated = False
    with opened_folder(root, inner, parts) as fd, os.scandir(fd) as scan:
        for item in scan:
            if len(entries) >= MAX_LISTED:
                truncated = True
                break
            try:
                info = item.stat(follow_symlinks=False)
            except OSError:
                continue  # removed meanwhile
            kind = _kind(info.st_mode)
            entries.append(
                Entry(
                    name=item.name,
                    kind=kind,
                    size=info.st_size if kind == "file" else None,
                    modified=info.st_mtime,
                )
            )
    entries.sort(key=lambda e: (e.kind != "folder", e.name.lower(), e.name))
    return Listing(entries=entries, truncated=truncated)


def _not_a_plain_file(info: os.stat_result, shown: str) -> PathRefused:
    if stat.S_ISLNK(info.st_mode):
        return PathRefused(
            _(
                "“%(path)s” is a symlink. The file browser follows no symlinks; download "
                "the file it points to from its real place."
            )
            % {"path": shown}
        )
    if stat.S_ISDIR(info.st_mode):
        return PathRefused(_("“%(path)s” is a folder: list it instead.") % {"path": shown})
    return PathRefused(
        _(
            "“%(path)s” is a device, a FIFO or a socket, not a regular file: the file "
            "browser reads and writes only regular files."
        )
        % {"path": shown}
    )


def open_file(root: str, inner: Sequence[str], parts: Sequence[str]) -> tuple[BinaryIO, int]:
    """The regular file at ``parts``, opened for reading, and its size."""
    if not parts:
        raise PathRefused(_("Name a file to download, not the top folder."))
    shown = _shown(parts)
    with opened_folder(root, inner, parts[:-1]) as folder:
        name = parts[-1]
        try:
            before = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except OSError as exc:
            raise _refusal(exc, folder, name, shown) from None
        if not stat.S_ISREG(before.st_mode):
            raise _not_a_plain_file(before, shown)
        # O_NONBLOCK: a FIFO swapped in after the lstat does not hang the worker.
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, dir_fd=folder)
        except OSError as exc:
            raise _refusal(exc, folder, name, shown) from None
        after = os.fstat(fd)
        if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino) or not stat.S_ISREG(
            after.st_mode
        ):
            os.close(fd)
            raise PathRefused(
                _("“%(path)s” changed while it was opened; try again.") % {"path": shown}
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), after.st_size


def write_file(
    root: str,
    inner: Sequence[str],
    parts: Sequence[str],
    name: str,
    chunks: Iterable[bytes],
    *,
    max_bytes: int,
    overwrite: bool = False,
) -> int:
    """Write ``chunks`` as ``name`` in the folder ``parts``; return the bytes written.

    Nothing is left behind when it fails: not the file, not a partial one.
    """
    name = clean_name(name)
    shown = _shown((*parts, name))
    with opened_folder(root, inner, parts) as folder:
        existing = _lstat_or_none(name, folder)
        if existing is not None:
            if not stat.S_ISREG(existing.st_mode):
                raise _not_a_plain_file(existing, shown)
            if not overwrite:
                raise AlreadyExists(
                    _("“%(path)s” already exists. Tick “replace” to overwrite it.")
                    % {"path": shown}
                )
        temporary = f".{name[:200]}.upload-{secrets.token_hex(6)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(temporary, flags, 0o644, dir_fd=folder)
        except OSError as exc:
            raise _refusal(exc, folder, temporary, shown) from None
        written = 0
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    written += len(chunk)
                    if written > max_bytes:
                        raise UploadTooLarge(too_large_message(written, max_bytes))
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            if overwrite:
                # rename replaces a symlink put there meanwhile; it never follows one.
                os.rename(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
            else:
                try:
                    os.link(
                        temporary,
                        name,
                        src_dir_fd=folder,
                        dst_dir_fd=folder,
                        follow_symlinks=False,
                    )
                except FileExistsError:
                    raise AlreadyExists(
                        _("“%(path)s” already exists. Tick “replace” to overwrite it.")
                        % {"path": shown}
                    ) from None
                os.unlink(temporary, dir_fd=folder)
        except BaseException:
            _remove_quietly(temporary, folder)
            raise
    return written


def too_large_message(size: int, max_bytes: int) -> str:
    return _(
        "The file is %(size)s; uploads through the portal take at most %(max)s. Copy "
        "larger files with the lab's shared storage tools, or split the file."
    ) % {"size": human_size(size), "max": human_size(max_bytes)}


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"  # pragma: no cover - the loop returns


def make_folder(root: str, inner: Sequence[str], parts: Sequence[str], name: str) -> None:
    name = clean_name(name)
    shown = _shown((*parts, name))
    with opened_folder(root, inner, parts) as folder:
        try:
            os.mkdir(name, 0o755, dir_fd=folder)
        except FileExistsError:
            raise AlreadyExists(_("“%(path)s” already exists.") % {"path": shown}) from None
        except OSError as exc:
            raise _refusal(exc, folder, name, shown) from None


def remove(root: str, inner: Sequence[str], parts: Sequence[str]) -> str:
    """Remove the file (or empty folder) at ``parts``; return its kind. A symlink is
    refused, not removed: it was not made through the portal."""
    if not parts:
        raise PathRefused(_("The top folder cannot be deleted."))
    shown = _shown(parts)
    with opened_folder(root, inner, parts[:-1]) as folder:
        name = parts[-1]
        try:
            info = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except OSError as exc:
            raise _refusal(exc, folder, name, shown) from None
        try:
            if stat.S_ISREG(info.st_mode):
                os.unlink(name, dir_fd=folder)  # unlink never follows a symlink
                return "file"
            if stat.S_ISDIR(info.st_mode):
                os.rmdir(name, dir_fd=folder)
                return "folder"
        except OSError as exc:
            if exc.errno == errno.ENOTEMPTY:
                raise PathRefused(
                    _("The folder “%(path)s” is not empty: delete what is in it first.")
                    % {"path": shown}
                ) from None
            raise _refusal(exc, folder, name, shown) from None
    raise _not_a_plain_file(info, shown)


def _lstat_or_none(name: str, folder: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _remove_quietly(name: str, folder: int) -> None:
    with suppress(OSError):
        os.unlink(name, dir_fd=folder)

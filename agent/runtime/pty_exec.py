"""A shell on a pseudo-terminal for the local-process runtime's jobs (the gateway's exec).

The shell is a session leader with the pty as its controlling terminal (``setsid
--ctty``), so a resize reaches it as SIGWINCH and job control works; closing ends
the whole session, background jobs included.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from agent.runtime.base import SHELL_COMMAND, ExecRefused, ExecSession

_CLOSE_WAIT_S = 1.0


def set_winsize(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _session_members(sid: int) -> list[int]:
    members = []
    for pid in psutil.pids():
        with contextlib.suppress(OSError):
            if os.getsid(pid) == sid:
                members.append(pid)
    return members


class PtyExec(ExecSession):
    """``SHELL_COMMAND`` on a new pty, with ``env`` in ``cwd`` (as ``uid``:``gid`` when root)."""

    def __init__(
        self,
        *,
        env: Mapping[str, str],
        cwd: Path,
        cols: int,
        rows: int,
        user: tuple[int, int] | None = None,
    ) -> None:
        master, slave = os.openpty()
        try:
            set_winsize(master, cols, rows)
            setsid = shutil.which("setsid")
            # Without util-linux's setsid the shell still runs, without job control.
            argv = [setsid, "--ctty", *SHELL_COMMAND] if setsid else list(SHELL_COMMAND)
            extra: dict[str, Any] = {}
            if user is not None:
                extra = {"user": user[0], "group": user[1], "extra_groups": []}
            self._proc = subprocess.Popen(
                argv,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=cwd,
                env={"TERM": "xterm-256color", **env},
                close_fds=True,
                start_new_session=setsid is None,
                **extra,
            )
        except OSError as exc:
            os.close(master)
            raise ExecRefused(f"could not start a shell: {exc}") from exc
        finally:
            os.close(slave)
        os.set_blocking(master, False)
        self.fd = master
        self._closed = False

    def resize(self, cols: int, rows: int) -> None:
        if not self._closed:
            set_winsize(self.fd, cols, rows)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # The shell's pid is its session's id: HUP every process of the session, as a
        # closed terminal would, then KILL what is left.
        sid = self._proc.pid
        for sig in (signal.SIGHUP, signal.SIGKILL):
            for pid in _session_members(sid):
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=_CLOSE_WAIT_S)
            if not _session_members(sid):
                break
            time.sleep(0.05)
        with contextlib.suppress(OSError):
            os.close(self.fd)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=_CLOSE_WAIT_S)


def process_environ(pid: int) -> dict[str, str] | None:
    """A process's environment as it started (``/proc/<pid>/environ``); ``None`` if unreadable."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    env = {}
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep:
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return env

"""What the gateway needs of the Docker engine: the sessions' network, and a shell in a job.

Session containers join ``labportal-sessions``, an internal bridge: no route out and
no published port, with inter-container traffic off, so only this node (its agent's
gateway) reaches a session's server, and one member's session cannot reach another's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable
from typing import Any

import docker
import psutil
from docker.errors import APIError, DockerException

from agent.runtime.base import LABEL_MANAGED, SHELL_COMMAND, ExecRefused, ExecSession

log = logging.getLogger(__name__)

SESSION_NETWORK = "labportal-sessions"
# The bridge's host-side name, fixed so that the node's firewall can name it: an
# internal network has no route to other hosts, but its containers still reach
# services of this host that listen on every address (docs/agent.md, Gateway).
SESSION_BRIDGE = "lp-sessions"


# New connections from the sessions' bridge into this host are dropped; the gateway's own
# connections into a session, and their answers, are established ones and pass.
GUARD_RULE = (
    "INPUT",
    "-i",
    SESSION_BRIDGE,
    "-m",
    "conntrack",
    "!",
    "--ctstate",
    "ESTABLISHED,RELATED",
    "-j",
    "DROP",
)


class SessionGuardError(Exception):
    """The firewall rule that keeps session containers from this host could not be set."""


def guard_session_bridge(
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
    which: Callable[[str], str | None] = shutil.which,
) -> None:
    """Make sure ``GUARD_RULE`` is in this host's IPv4 and IPv6 firewalls (idempotent).

    An internal network has no route to other hosts, but its containers reach every
    service of this host that listens on all addresses (the broker, a database, an
    SSH daemon). The agent sets the rule itself rather than trusting the node's admin
    to: a session does not start unless IPv4's is in place (IPv6's where the host has
    ip6tables).
    """
    for tool, required in (("iptables", True), ("ip6tables", False)):
        exe = which(tool)
        if exe is None:
            if required:
                raise SessionGuardError(
                    "iptables is not installed: the agent needs it to keep session "
                    "containers from this node's own services (install iptables)"
                )
            continue
        if run([exe, "-w", "-C", *GUARD_RULE], capture_output=True, text=True).returncode == 0:
            continue
        added = run([exe, "-w", "-I", *GUARD_RULE], capture_output=True, text=True)
        if added.returncode != 0:
            if not required:
                log.warning("could not set the IPv6 rule for %s: %s", SESSION_BRIDGE, added.stderr)
                continue
            raise SessionGuardError(
                f"could not set the firewall rule that keeps session containers from this "
                f"node's own services ({' '.join(GUARD_RULE)}): {added.stderr.strip()}; "
                "the agent must run as root to start sessions"
            )


def ensure_session_network(client: docker.DockerClient, node: str) -> None:
    """Create the internal sessions network unless it exists (safe to race: 409 is fine)."""
    if client.networks.list(names=[SESSION_NETWORK]):
        return
    try:
        client.networks.create(
            SESSION_NETWORK,
            driver="bridge",
            internal=True,
            labels={LABEL_MANAGED: "true"},
            options={
                "com.docker.network.bridge.enable_icc": "false",
                "com.docker.network.bridge.name": SESSION_BRIDGE,
            },
        )
    except APIError as exc:
        if exc.status_code != 409 and not client.networks.list(names=[SESSION_NETWORK]):
            raise


class DockerExec(ExecSession):
    """``docker exec -it`` of ``SHELL_COMMAND`` as the container's user, in its workdir and env."""

    def __init__(
        self, api: Any, container_id: str, *, user: str | None, cols: int, rows: int
    ) -> None:
        self._api = api
        try:
            created = api.exec_create(
                container_id,
                SHELL_COMMAND,
                stdin=True,
                tty=True,
                user=user or "",
                environment={"TERM": "xterm-256color"},
            )
            self._exec_id = created["Id"]
            self._sock = api.exec_start(self._exec_id, tty=True, socket=True)
        except (DockerException, OSError) as exc:
            raise ExecRefused(f"the engine could not open a shell: {exc}") from exc
        # docker-py hands back the socket wrapped in a SocketIO on a Unix socket.
        raw: socket.socket = getattr(self._sock, "_sock", self._sock)
        raw.setblocking(False)
        self._raw = raw
        self.fd = raw.fileno()
        self._closed = False
        self.resize(cols, rows)

    def resize(self, cols: int, rows: int) -> None:
        if self._closed:
            return
        try:
            self._api.exec_resize(self._exec_id, height=rows, width=cols)
        except (DockerException, OSError) as exc:
            log.debug("resize of exec %s failed: %s", self._exec_id, exc)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # The engine leaves an exec's processes running when its stream closes
        # (moby#9098): HUP the shell's session, as a closed terminal would.
        pid = 0
        with contextlib.suppress(DockerException, KeyError):
            pid = int(self._api.exec_inspect(self._exec_id).get("Pid") or 0)
        if pid > 0:
            _hang_up(pid)
        with contextlib.suppress(OSError):
            self._raw.close()
        with contextlib.suppress(OSError, AttributeError):
            self._sock.close()


def _hang_up(sid: int) -> None:
    """SIGHUP then SIGKILL every process of the host session ``sid`` (the exec's shell)."""
    try:
        members = [p for p in psutil.pids() if _sid(p) == sid]
    except psutil.Error:
        return
    for sig in (signal.SIGHUP, signal.SIGKILL):
        for pid in members:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        with contextlib.suppress(psutil.Error):
            psutil.wait_procs([psutil.Process(p) for p in members if psutil.pid_exists(p)], 0.5)
        members = [p for p in members if psutil.pid_exists(p)]
        if not members:
            return
    if members:
        log.warning("could not end the exec's processes %s (agent not root?)", members)


def _sid(pid: int) -> int:
    try:
        return os.getsid(pid)
    except OSError:
        return -1

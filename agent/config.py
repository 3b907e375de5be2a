"""The agent's configuration: command-line flags over environment variables over defaults.

Every problem is a ``ConfigError`` whose message names the flag and the
variable and says how to fix it; ``agent.main`` prints it and exits 2.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.gpu import BACKEND_CHOICES
from agent.runtime import RUNTIME_CHOICES
from protocol.messages import MAX_GATEWAY_URL_CHARS

# Node names end up in a queue name (node.<name>) and in container names.
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class ConfigError(Exception):
    """A setting is missing or invalid; the message says which and how to fix it."""


@dataclass(frozen=True)
class AgentConfig:
    name: str
    broker_url: str
    token: str
    gpu_backend: str = "auto"
    runtime: str = "docker"
    allow_local_runtime: bool = False
    sim_gpus: int = 2
    sim_seed: int = 0
    sample_interval_s: float = 5.0
    heartbeat_interval_s: float = 5.0
    samples_per_batch: int = 6
    state_dir: Path = Path("/var/lib/labportal-agent")
    allowed_mount_roots: tuple[str, ...] = field(default_factory=tuple)
    # Where jobs' working folders are made, on shared storage ("": none).
    job_dir_root: str = ""
    concurrency: int = 4
    log_level: str = "INFO"
    print_info: bool = False
    monitor_only: bool = False
    # The gateway (agent.gateway): where it listens, and the URL the portal is told.
    gateway_listen: tuple[str, int] | None = None
    gateway_url: str | None = None


# (flag, variable, help)
_SETTINGS: list[tuple[str, str, str]] = [
    ("--name", "LABPORTAL_NODE_NAME", "this node's name in the portal, e.g. gpu01"),
    ("--broker", "LABPORTAL_BROKER_URL", "the Celery broker URL, e.g. redis://portal:6379/0"),
    ("--token", "LABPORTAL_NODE_TOKEN", "the node token an admin created in the portal"),
    ("--gpu-backend", "LABPORTAL_GPU_BACKEND", "nvml, simulated or auto (default auto)"),
    ("--runtime", "LABPORTAL_RUNTIME", "docker or local (default docker)"),
    ("--sim-gpus", "LABPORTAL_SIM_GPUS", "GPUs the simulated backend reports (default 2)"),
    ("--sim-seed", "LABPORTAL_SIM_SEED", "seed of the simulated backend (default 0)"),
    ("--sample-interval", "LABPORTAL_SAMPLE_INTERVAL", "seconds between GPU samples (default 5)"),
    (
        "--heartbeat-interval",
        "LABPORTAL_HEARTBEAT_INTERVAL",
        "seconds between heartbeats (default 5)",
    ),
    ("--sample-batch", "LABPORTAL_SAMPLE_BATCH", "sampling rounds per samples message (default 6)"),
    ("--state-dir", "LABPORTAL_AGENT_STATE_DIR", "where the agent keeps local state"),
    ("--concurrency", "LABPORTAL_AGENT_CONCURRENCY", "tasks run at once (default 4)"),
    ("--log-level", "LABPORTAL_LOG_LEVEL", "DEBUG, INFO, WARNING or ERROR (default INFO)"),
    (
        "--job-dir-root",
        "LABPORTAL_JOB_DIR_ROOT",
        "make each job's working folder as DIR/<user>/<job id>, mounted at /job (shared "
        "storage the portal mounts too; default: none)",
    ),
    (
        "--gateway-listen",
        "LABPORTAL_AGENT_GATEWAY_LISTEN",
        "HOST:PORT of this node's private address where the portal reaches its gateway "
        "(sessions, terminals); unset: no gateway",
    ),
    (
        "--gateway-url",
        "LABPORTAL_AGENT_GATEWAY_URL",
        "the gateway's URL as the portal reaches it (default http://HOST:PORT of --gateway-listen)",
    ),
]
_VAR = {flag: var for flag, var, _ in _SETTINGS}


def default_state_dir(env: Mapping[str, str]) -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/labportal-agent")
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "labportal-agent"


class _ParserError(Exception):
    pass


class _RaisingParser(argparse.ArgumentParser):
    """Raises instead of printing usage and exiting, so the CLI reports all errors one way."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _ParserError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _RaisingParser(
        prog="labportal-agent",
        description="LabPortal node agent: runs jobs on this server's GPUs for the portal.",
        epilog="Each flag may instead be given by the environment variable shown.",
    )
    for flag, var, text in _SETTINGS:
        parser.add_argument(flag, default=None, help=f"{text} [env {var}]")
    parser.add_argument(
        "--allow-local-runtime",
        action="store_true",
        default=None,
        help="permit --runtime local, which isolates nothing (demo only) "
        "[env LABPORTAL_ALLOW_LOCAL_RUNTIME=1]",
    )
    parser.add_argument(
        "--monitor-only",
        action="store_true",
        default=None,
        help="only report GPU telemetry (e.g. on a Slurm node): no container runtime, "
        "job commands refused [env LABPORTAL_MONITOR_ONLY=1]",
    )
    parser.add_argument(
        "--gateway-listen-all",
        action="store_true",
        default=None,
        help="let --gateway-listen name every interface (0.0.0.0 or ::), e.g. inside a "
        "container; needs --gateway-url [env LABPORTAL_AGENT_GATEWAY_LISTEN_ALL=1]",
    )
    parser.add_argument(
        "--allowed-mount-root",
        action="append",
        default=None,
        metavar="DIR",
        help="required: jobs may mount only from under DIR (repeatable; `none` allows no "
        "mounts) [env LABPORTAL_ALLOWED_MOUNT_ROOTS, colon-separated]",
    )
    parser.add_argument(
        "--print-info",
        action="store_true",
        help="discover the GPUs, print what would be registered as JSON, and exit "
        "(needs no broker or token)",
    )
    return parser


def load_config(argv: Sequence[str] | None, env: Mapping[str, str]) -> AgentConfig:
    """Read flags (``argv``) over ``env`` over defaults; raise ``ConfigError`` on any problem."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except _ParserError as exc:
        raise ConfigError(f"{exc}. Run `labportal-agent --help` for the options.") from None

    def raw(flag: str) -> str | None:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is None:
            value = env.get(_VAR[flag])
        return value.strip() if isinstance(value, str) else value

    def where(flag: str) -> str:
        return f"{_VAR[flag]} (--{flag.lstrip('-')})"

    def required(flag: str, how: str) -> str:
        value = raw(flag)
        if not value:
            raise ConfigError(f"{where(flag)} is not set. {how}")
        return value

    def choice(flag: str, default: str, choices: Sequence[str]) -> str:
        value = (raw(flag) or default).lower()
        if value not in choices:
            raise ConfigError(
                f"{where(flag)} is {value!r}; set it to one of: {', '.join(choices)}."
            )
        return value

    def number(flag: str, default: float, kind: type, minimum: float) -> float:
        value = raw(flag)
        if value is None or value == "":
            return default
        try:
            parsed = kind(value)
        except ValueError:
            raise ConfigError(
                f"{where(flag)} is {value!r}, which is not a"
                f"{'n integer' if kind is int else ' number'}; set it to e.g. {default}."
            ) from None
        if parsed < minimum:
            raise ConfigError(f"{where(flag)} is {value}; it must be at least {minimum}.")
        return parsed

    print_info = bool(args.print_info)
    name = raw("--name") or ""
    if not name and print_info:
        name = "unnamed"
    if not name:
        raise ConfigError(
            f"{where('--name')} is not set. Set it to this node's name as the portal knows it, "
            "e.g. --name gpu01."
        )
    if not _NODE_NAME.match(name):
        raise ConfigError(
            f"{where('--name')} is {name!r}; use letters, digits, '.', '_' and '-' only "
            "(at most 63 characters, starting with a letter or digit)."
        )
    if print_info:
        broker, token = raw("--broker") or "", raw("--token") or ""
    else:
        broker = required(
            "--broker", "Set it to the portal's Celery broker, e.g. redis://portal.lab:6379/0."
        )
        if "://" not in broker:
            raise ConfigError(
                f"{where('--broker')} is not a URL; write it as scheme://..., "
                "e.g. redis://portal.lab:6379/0."
            )
        token = required(
            "--token",
            "Create a node token in the portal (admin > Nodes > node tokens) and pass it "
            "with --token or the variable.",
        )

    allow_local_raw = _switch(
        args.allow_local_runtime, env, "LABPORTAL_ALLOW_LOCAL_RUNTIME", "allow the local runtime"
    )
    monitor_only = _switch(
        args.monitor_only, env, "LABPORTAL_MONITOR_ONLY", "run the agent in monitor-only mode"
    )

    if args.allowed_mount_root is not None:
        roots = tuple(args.allowed_mount_root)
    else:
        roots = tuple(r for r in env.get("LABPORTAL_ALLOWED_MOUNT_ROOTS", "").split(":") if r)
    roots_given = bool(roots)
    if roots == ("none",):
        roots = ()
    for root in roots:
        if not root.startswith("/") or ".." in Path(root).parts:
            raise ConfigError(
                f"LABPORTAL_ALLOWED_MOUNT_ROOTS (--allowed-mount-root) has {root!r}; "
                "each root must be an absolute path without '..'."
            )

    job_dir_root = raw("--job-dir-root") or ""
    if job_dir_root and (not job_dir_root.startswith("/") or ".." in Path(job_dir_root).parts):
        raise ConfigError(
            f"{where('--job-dir-root')} is {job_dir_root!r}; it must be an absolute path "
            "without '..'."
        )

    log_level = (raw("--log-level") or "INFO").upper()
    if log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(
            f"{where('--log-level')} is {log_level!r}; use DEBUG, INFO, WARNING or ERROR."
        )
    state_dir = raw("--state-dir")
    if not roots_given and not print_info and not monitor_only:
        raise ConfigError(
            "LABPORTAL_ALLOWED_MOUNT_ROOTS (--allowed-mount-root) is not set. Name the host "
            "directories that jobs may mount from (e.g. --allowed-mount-root /data "
            "--allowed-mount-root /home), or `--allowed-mount-root none` to allow no mounts."
        )
    listen_all = _switch(
        args.gateway_listen_all,
        env,
        "LABPORTAL_AGENT_GATEWAY_LISTEN_ALL",
        "let the gateway listen on every interface",
    )
    gateway_listen, gateway_url = _gateway(
        raw("--gateway-listen"), raw("--gateway-url"), listen_all
    )
    if gateway_listen is not None and monitor_only:
        raise ConfigError(
            "LABPORTAL_AGENT_GATEWAY_LISTEN (--gateway-listen) is set, but a monitor-only agent "
            "runs no jobs to reach; leave it unset."
        )
    return AgentConfig(
        name=name,
        broker_url=broker,
        token=token,
        gpu_backend=choice("--gpu-backend", "auto", BACKEND_CHOICES),
        runtime=choice("--runtime", "docker", RUNTIME_CHOICES),
        allow_local_runtime=bool(allow_local_raw),
        sim_gpus=int(number("--sim-gpus", 2, int, 0)),
        sim_seed=int(number("--sim-seed", 0, int, 0)),
        sample_interval_s=float(number("--sample-interval", 5.0, float, 0.1)),
        heartbeat_interval_s=float(number("--heartbeat-interval", 5.0, float, 0.1)),
        samples_per_batch=int(number("--sample-batch", 6, int, 1)),
        state_dir=Path(state_dir) if state_dir else default_state_dir(env),
        allowed_mount_roots=roots,
        job_dir_root=job_dir_root,
        concurrency=int(number("--concurrency", 4, int, 1)),
        log_level=log_level,
        print_info=print_info,
        monitor_only=monitor_only,
        gateway_listen=gateway_listen,
        gateway_url=gateway_url,
    )


_WILDCARDS = {"", "0.0.0.0", "::", "*"}
_GATEWAY_URL = re.compile(r"^https?://[^\s/?#]+/?$")


def _gateway(
    listen: str | None, url: str | None, listen_all: bool
) -> tuple[tuple[str, int] | None, str | None]:
    """The gateway's (host, port) and advertised URL; both ``None`` without --gateway-listen."""
    where = "LABPORTAL_AGENT_GATEWAY_LISTEN (--gateway-listen)"
    if not listen:
        if url:
            raise ConfigError(
                "LABPORTAL_AGENT_GATEWAY_URL (--gateway-url) is set without --gateway-listen; "
                "set both, e.g. --gateway-listen 10.0.0.5:8765."
            )
        return None, None
    host, sep, port_text = listen.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(
            f"{where} is {listen!r}; write it as HOST:PORT with a port from 1 to 65535, "
            "e.g. 10.0.0.5:8765."
        )
    if host in _WILDCARDS and not listen_all:
        raise ConfigError(
            f"{where} is {listen!r}, every interface. Name this node's private address that "
            "the portal reaches (e.g. 10.0.0.5:8765), or pass --gateway-listen-all and "
            "--gateway-url if it must listen everywhere (say, inside a container)."
        )
    if url is None and host in _WILDCARDS:
        raise ConfigError(
            "LABPORTAL_AGENT_GATEWAY_URL (--gateway-url) is not set, and the gateway listens on "
            "every interface; set it to the URL the portal reaches, e.g. http://10.0.0.5:8765."
        )
    if url is None:
        url = f"http://[{host}]:{port_text}" if ":" in host else f"http://{host}:{port_text}"
    if not _GATEWAY_URL.match(url) or len(url) > MAX_GATEWAY_URL_CHARS:
        raise ConfigError(
            f"LABPORTAL_AGENT_GATEWAY_URL (--gateway-url) is {url!r}; write it as "
            f"http://HOST:PORT (no path), at most {MAX_GATEWAY_URL_CHARS} characters."
        )
    return (host, int(port_text)), url.rstrip("/")


def _switch(flag: bool | None, env: Mapping[str, str], var: str, meaning: str) -> bool:
    """An on/off option: the flag if given, else the variable (1/0, true/false, yes/no)."""
    if flag is not None:
        return bool(flag)
    text = env.get(var, "").strip().lower()
    if text not in _TRUE | _FALSE:
        raise ConfigError(f"{var} is {text!r}; set it to 1 to {meaning}, or 0.")
    return text in _TRUE

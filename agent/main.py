"""``labportal-agent``: the node agent's command line.

Start-up order: discover the GPUs, reconcile the jobs already on the node,
register with the portal, then start the background loop (watch, sample,
heartbeat) and the Celery worker that consumes only ``node.<name>``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from celery import signals
from celery.worker import state as worker_state
from kombu.utils.url import maybe_sanitize_url

from agent.config import AgentConfig, ConfigError, load_config
from agent.gpu import GpuBackend, GpuBackendUnavailable, select_backend
from agent.node import AgentTiming, NodeAgent
from agent.reporter import ControlReporter
from agent.runtime import ContainerRuntime, RuntimeUnavailable, build_runtime

log = logging.getLogger("agent")

EXIT_CONFIG = 2
EXIT_BROKER = 3

# How often the worker's event loop turns while commands are in flight (see AckTicker).
ACK_TICK_S = 0.02
# Ticks with no command in flight before the ticking stops (about a second).
ACK_IDLE_TICKS = 50


class AckTicker:
    """Keeps the worker's event loop turning every ACK_TICK_S while commands are in flight.

    A task run by the threads pool is acknowledged only when the event loop next wakes
    (celery/celery#6941), and with Redis an idle loop sleeps up to a second. When
    ``concurrency`` commands arrive at once (the ends of jobs started together), the
    prefetch window stays full of finished but unacknowledged tasks, and the next start
    commands wait that second while the GPUs stand idle.

    Ticking all the time cost an idle agent about 1.6 % of a core (0.5 s of CPU in 30 s),
    so the ticks start when a command is received and stop once none has been in flight
    for ACK_IDLE_TICKS ticks, long after its acknowledgement. Both signals and the ticks
    run in the worker's event-loop thread.
    """

    def __init__(self) -> None:
        self.timer: Any = None
        self.entry: Any = None
        self.idle = 0

    def connect(self) -> None:
        signals.worker_ready.connect(self.on_ready, weak=False)
        signals.task_received.connect(self.on_received, weak=False)

    def on_ready(self, sender: object = None, **_kwargs: object) -> None:
        self.timer = getattr(sender, "timer", None)

    def on_received(self, **_kwargs: object) -> None:
        self.idle = 0
        if self.entry is None and self.timer is not None:
            self.entry = self.timer.call_repeatedly(ACK_TICK_S, self.tick)

    def tick(self) -> None:
        if worker_state.active_requests or worker_state.reserved_requests:
            self.idle = 0
            return
        self.idle += 1
        if self.idle >= ACK_IDLE_TICKS and self.entry is not None:
            self.entry.cancel()
            self.entry = None


def _fail(message: str, code: int = EXIT_CONFIG) -> int:
    print(f"labportal-agent: error: {message}", file=sys.stderr)
    return code


def _backend(cfg: AgentConfig) -> GpuBackend:
    return select_backend(
        cfg.gpu_backend, node_name=cfg.name, sim_gpus=cfg.sim_gpus, sim_seed=cfg.sim_seed
    )


def broker_transport_options(broker_url: str) -> dict[str, object]:
    """Transport options implied by the URL.

    ``filesystem:///some/dir`` (the serverless demo broker) keeps its messages
    in that folder, which the portal's processes must name too.
    """
    parts = urlsplit(broker_url)
    if parts.scheme == "filesystem" and parts.path not in ("", "/"):
        folder = parts.path
        os.makedirs(folder, exist_ok=True)
        # Fanout exchanges (worker remote control) live beside the queue folder, as
        # the portal's settings place them, instead of in the working directory.
        control = os.path.join(os.path.dirname(folder.rstrip("/")), "control")
        os.makedirs(control, exist_ok=True)
        return {
            "data_folder_in": folder,
            "data_folder_out": folder,
            "control_folder": control,
            "store_processed": False,
            # One message per poll: the default 1 s poll lets job events queue up.
            "polling_interval": 0.05,
            "visibility_timeout": 3600,
        }
    return {"visibility_timeout": 3600}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the agent until the worker stops; return the process exit code."""
    try:
        cfg = load_config(argv, os.environ)
    except ConfigError as exc:
        return _fail(str(exc))
    logging.basicConfig(
        level=cfg.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    try:
        backend = _backend(cfg)
    except GpuBackendUnavailable as exc:
        return _fail(
            f"LABPORTAL_GPU_BACKEND (--gpu-backend) is nvml, but {exc}. Check the NVIDIA "
            "driver (`nvidia-smi`), or use --gpu-backend simulated on a machine without GPUs."
        )
    if cfg.print_info:
        info = {
            "gpu_backend": backend.name,
            "gpus": [g.as_wire() for g in backend.discover()],
            "samples": [s.as_wire() for s in backend.sample(0.0)],
        }
        print(json.dumps(info, indent=2))
        backend.close()
        return 0

    try:
        cfg.state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return _fail(
            f"LABPORTAL_AGENT_STATE_DIR (--state-dir) {str(cfg.state_dir)!r} cannot be "
            f"created ({exc.strerror}); point it at a directory this user may write."
        )
    runtime: ContainerRuntime | None = None
    if cfg.monitor_only:
        log.info("monitor-only: no container runtime; job commands will be refused")
    else:
        try:
            runtime = build_runtime(
                cfg.runtime,
                node_name=cfg.name,
                state_dir=cfg.state_dir,
                allow_local=cfg.allow_local_runtime,
                gpu_device_requests=backend.name != "simulated",
            )
        except RuntimeUnavailable as exc:
            return _fail(f"LABPORTAL_RUNTIME (--runtime) is {cfg.runtime}, but {exc}")

    # Imported here so that a config error costs no Celery import time.
    from agent import tasks
    from agent.celery_app import configure, node_queue
    from protocol.broker import rejections
    from protocol.signing import CommandVerifier, NonceLedger

    app = configure(cfg.broker_url)
    app.conf.broker_transport_options = broker_transport_options(cfg.broker_url)
    # Job events the broker could not take wait on disk, so a restart keeps them too.
    reporter = ControlReporter(app, cfg.name, cfg.token, outbox_dir=cfg.state_dir / "outbox")
    node_agent = NodeAgent(
        node=cfg.name,
        backend=backend,
        runtime=runtime,
        reporter=reporter,
        timing=AgentTiming(
            sample_interval_s=cfg.sample_interval_s,
            heartbeat_interval_s=cfg.heartbeat_interval_s,
            samples_per_batch=cfg.samples_per_batch,
        ),
        allowed_mount_roots=cfg.allowed_mount_roots,
        job_dir_root=cfg.job_dir_root,
        verifier=CommandVerifier(
            cfg.token, cfg.name, NonceLedger(cfg.state_dir / "seen-command-nonces.json")
        ),
        gateway_url=cfg.gateway_url,
        log_state_dir=cfg.state_dir / "log-offsets",
    )
    tasks.set_node_agent(node_agent)
    # A message on node.<name> that is no command at all is dropped (protocol.broker) and
    # shown to the portal's admins like a forged command.
    rejections.connect(
        lambda dropped: reporter.refusal(
            dropped.task or f"({dropped.kind})", dropped.kind, dropped.detail[:500]
        )
    )

    gateway = None
    if cfg.gateway_listen is not None and runtime is not None:
        from agent.gateway import Gateway, GatewayServer

        gateway = GatewayServer(
            Gateway(node=cfg.name, token=cfg.token, runtime=runtime), *cfg.gateway_listen
        )
        try:
            gateway.start()
        except OSError as exc:
            return _fail(
                f"LABPORTAL_AGENT_GATEWAY_LISTEN (--gateway-listen) cannot listen on "
                f"{cfg.gateway_listen[0]}:{cfg.gateway_listen[1]} ({exc.strerror or exc}); "
                "is the port taken, or the address not this server's?"
            )

    # The node_info call inside register() discovers GPUs before reconcile
    # checks anything against them.
    node_agent.node_info()
    node_agent.reconcile()
    try:
        node_agent.register()
    except Exception as exc:
        return _fail(
            f"cannot reach the broker at {maybe_sanitize_url(cfg.broker_url)} to register "
            f"({exc}). Check LABPORTAL_BROKER_URL (--broker) and that the portal's broker "
            "is reachable from this server.",
            EXIT_BROKER,
        )

    stop = threading.Event()
    loop = threading.Thread(
        target=node_agent.run_loops, args=(stop,), name="agent-telemetry", daemon=True
    )
    loop.start()
    AckTicker().connect()
    try:
        worker = app.Worker(
            queues=[node_queue(cfg.name)],
            hostname=f"agent@{cfg.name}",
            # Threads, not processes: the runtime and backend state (and the
            # local runtime's child processes) live in this one process.
            pool="threads",
            concurrency=cfg.concurrency,
            prefetch_multiplier=1,
            without_gossip=True,
            without_mingle=True,
            loglevel=cfg.log_level,
        )
        worker.start()
        return int(worker.exitcode or 0)
    finally:
        stop.set()
        loop.join(timeout=10)
        if gateway is not None:
            gateway.stop()
        if runtime is not None:
            runtime.close()
        if node_agent.logstream is not None:
            node_agent.logstream.stop()
        backend.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

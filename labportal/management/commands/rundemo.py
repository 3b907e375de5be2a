"""Run the demo lab: web (gunicorn), a control worker with beat, and one agent per node.

Everything runs on the embedded defaults: SQLite, kombu's filesystem broker, the
simulated GPU backend and the local-process runtime. The simulation is named as
such in the UI. Ctrl-C stops every process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from labportal.management.commands.seed_demo import DEMO_PASSWORD


class Command(BaseCommand):
    help = "Serve the demo lab on 127.0.0.1:8000 with its worker and simulated agents."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--bind", default="127.0.0.1:8000")
        parser.add_argument("--no-agents", action="store_true", help="Start web and worker only.")

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.DEBUG:
            raise CommandError("rundemo is for the demo lab; it refuses to run with DEBUG=false.")
        agents_file = settings.VAR_DIR / "demo-agents.json"
        if not agents_file.exists():
            raise CommandError("No demo lab yet: run `python manage.py seed_demo` first.")
        bin_dir = os.path.dirname(sys.executable)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        commands: list[tuple[str, list[str], dict[str, str]]] = [
            ("web", [os.path.join(bin_dir, "gunicorn"), "labportal.wsgi:application",
                     "--bind", options["bind"], "--workers", "2", "--threads", "4",
                     "--access-logfile", "-"], env),
            ("control", [os.path.join(bin_dir, "celery"), "-A", "labportal", "worker",
                         "--beat", "--queues", "control", "--concurrency", "2",
                         "--loglevel", "INFO", "--hostname", "control@%h",
                         "--schedule", str(settings.VAR_DIR / "celerybeat-schedule")], env),
        ]
        if not options["no_agents"] and importlib.util.find_spec("agent.main") is not None:
            for agent in json.loads(agents_file.read_text()):
                agent_env = {
                    **env,
                    "LABPORTAL_NODE_NAME": agent["name"],
                    "LABPORTAL_NODE_TOKEN": agent["token"],
                    "LABPORTAL_BROKER_URL": settings.CELERY_BROKER_URL,
                    "LABPORTAL_BROKER_DIR": str(settings.BROKER_DIR),
                    "LABPORTAL_GPU_BACKEND": "simulated",
                    "LABPORTAL_SIM_GPUS": str(agent["gpus"]),
                    "LABPORTAL_RUNTIME": "local",
                    "LABPORTAL_ALLOW_LOCAL_RUNTIME": "1",
                    "LABPORTAL_AGENT_STATE_DIR": str(settings.VAR_DIR / "agents" / agent["name"]),
                }
                commands.append((agent["name"], [os.path.join(bin_dir, "labportal-agent")], agent_env))

        procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        for name, argv, proc_env in commands:
            self.stdout.write(f"starting {name}: {' '.join(argv[:3])} …")
            procs.append((name, subprocess.Popen(argv, env=proc_env, start_new_session=True)))
        host = options["bind"]
        self.stdout.write(self.style.SUCCESS(
            f"\nLabPortal demo (simulated GPUs, local-process runtime) on http://{host}/\n"
            f"Log in as admin, alice, bob or charlie with the password {DEMO_PASSWORD!r}.\n"
            "Press Ctrl-C to stop.\n"
        ))
        stopping = False

        def stop(*_: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        try:
            while not stopping:
                for name, proc in procs:
                    if proc.poll() is not None:
                        self.stderr.write(f"{name} exited with {proc.returncode}; stopping the demo.")
                        stopping = True
                time.sleep(0.5)
        finally:
            for _name, proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            for _name, proc in procs:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)

"""Run the demo lab: web (uvicorn), a control worker, Celery beat, and one agent per node.

Everything runs on the embedded defaults: SQLite, kombu's filesystem broker, the
simulated GPU backend and the local-process runtime. The portal names all of this
as simulation. Ctrl-C stops every process.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from demo.management.commands.seed_demo import DEMO_PASSWORD
from labportal.devstack import Stack, free_port, wait_for_port


class Command(BaseCommand):
    help = "Serve the demo lab on 127.0.0.1:8000 with its worker and simulated agents."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-agents", action="store_true", help="Start web and worker only.")

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.DEBUG:
            raise CommandError("rundemo is for the demo lab; it refuses to run with DEBUG=false.")
        agents_file = settings.VAR_DIR / "demo-agents.json"
        if not agents_file.exists():
            raise CommandError("No demo lab yet: run `python manage.py seed_demo` first.")
        import os

        log_dir = settings.VAR_DIR / "logs"
        # Job folders (Files, a job's outputs) under var/, shared by the portal and its agents
        # as the lab's storage would be; an operator's own setting wins.
        job_root = Path(settings.LABPORTAL_JOB_DIR_ROOT or settings.VAR_DIR / "jobs")
        job_root.mkdir(parents=True, exist_ok=True)
        files_roots = ":".join(dict.fromkeys([*settings.LABPORTAL_FILES_ROOTS, str(job_root)]))
        portal_env = {"LABPORTAL_JOB_DIR_ROOT": str(job_root), "LABPORTAL_FILES_ROOTS": files_roots}
        stack = Stack(env={**os.environ, "PYTHONUNBUFFERED": "1", **portal_env}, log_dir=log_dir)
        stack.web(options["port"])
        stack.control_worker(settings.VAR_DIR / "celerybeat-schedule")
        broker = settings.CELERY_BROKER_URL
        if broker.startswith("filesystem://"):
            # The agents share the portal's message folder.
            broker = f"filesystem://{settings.BROKER_DIR / 'out'}"
        if not options["no_agents"]:
            for agent in json.loads(agents_file.read_text()):
                stack.agent(
                    name=agent["name"],
                    token=agent["token"],
                    broker=broker,
                    runtime="local",
                    gpus=agent["gpus"],
                    state_dir=settings.VAR_DIR / "agents" / agent["name"],
                    # Sessions and terminals: the portal reaches each agent's gateway here.
                    gateway=f"127.0.0.1:{free_port()}",
                    job_dir_root=job_root,
                )
        stopping = False

        def stop(*_: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        try:
            wait_for_port(options["port"], timeout_s=60)
            self.stdout.write(
                self.style.SUCCESS(
                    f"\nLabPortal demo on http://127.0.0.1:{options['port']}/  "
                    "(SIMULATED GPUs, jobs run as local processes)\n"
                    f"Log in as admin, alice, bob or charlie with the password {DEMO_PASSWORD!r}.\n"
                    f"Process logs: {log_dir}/  ·  Press Ctrl-C to stop.\n"
                )
            )
            while not stopping:
                stack.check_alive()
                time.sleep(0.5)
        except (RuntimeError, TimeoutError) as exc:
            self.stderr.write(f"{exc}; stopping the demo.")
            for name in stack.procs:
                self.stderr.write(f"--- {name}\n{stack.tail(name, 15)}")
        finally:
            stack.stop()

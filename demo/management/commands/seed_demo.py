"""Seed the demo lab: an admin, three members in two categories, two simulated nodes."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import transaction

from accounts.models import Category, User
from agent.gpu.simulated import simulated_gpu_uuid
from cluster.models import Gpu, Node, NodeToken

DEMO_PASSWORD = "labportal-demo"
DEMO_NODES = ("sim-node-1", "sim-node-2")
DEMO_PURCHASES = (dt.date(2023, 9, 15), dt.date(2025, 3, 1))
DEMO_SHARED_SLOTS = 2
DEMO_GPUS_PER_NODE = 4
DEMO_GPU_MODEL = "Simulated A100 80GB"
DEMO_GPU_MEMORY_MB = 81920
# The demo categories' Chinese names (the English ones are their identifiers).
DEMO_CATEGORIES_ZH = {
    "PhD, thesis phase": "博士（论文阶段）",
    "Master": "硕士",
    "Staff": "教职工",
}


class Command(BaseCommand):
    help = "Create the demo lab (idempotent). Writes agent tokens to var/demo-agents.json."

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        phd, _ = Category.objects.get_or_create(
            name="PhD, thesis phase",
            defaults={
                "fairshare_weight": 30,
                "credit_multiplier": Decimal("1.5"),
                "priority_factor": 0.8,
                "max_concurrent_gpus": 8,
            },
        )
        master, _ = Category.objects.get_or_create(
            name="Master",
            defaults={
                "fairshare_weight": 10,
                "credit_multiplier": Decimal("1.0"),
                "priority_factor": 0.4,
                "max_concurrent_gpus": 4,
            },
        )
        Category.objects.get_or_create(name="Staff", defaults={"fairshare_weight": 20})
        # A demo lab seeded before categories had Chinese names gets them too.
        for name, name_zh in DEMO_CATEGORIES_ZH.items():
            Category.objects.filter(name=name, name_zh_hans="").update(name_zh_hans=name_zh)
        if not User.objects.filter(username="admin").exists():
            User.objects.create_superuser("admin", "admin@lab.example", DEMO_PASSWORD)
        for username, category in (("alice", phd), ("bob", phd), ("charlie", master)):
            if not User.objects.filter(username=username).exists():
                user = User.objects.create_user(
                    username, f"{username}@lab.example", DEMO_PASSWORD, category=category
                )
                user.ensure_unix_ids()

        from jobqueue.models import ContainerImage

        ContainerImage.objects.get_or_create(
            reference="labportal/demo-local",
            defaults={
                "description": "Demo only: the local-process runtime runs the command on the host."
            },
        )
        # The guided first job (the tutorial's first step), on the demo's local runtime.
        from handbook.hello_gpu import hello_gpu_template_ensure

        hello_gpu_template_ensure(image="labportal/demo-local")
        agents = []
        for name in DEMO_NODES:
            node, _ = Node.objects.get_or_create(
                name=name,
                defaults={
                    "address": "127.0.0.1",
                    # What the usage report's inventory lists (an admin enters it per node).
                    "purchased_on": DEMO_PURCHASES[DEMO_NODES.index(name) % len(DEMO_PURCHASES)],
                    "funded_by": "Demo: department equipment budget",
                },
            )
            for index in range(DEMO_GPUS_PER_NODE):
                Gpu.objects.get_or_create(
                    uuid=simulated_gpu_uuid(name, index),
                    defaults={
                        "node": node,
                        "index": index,
                        "model": DEMO_GPU_MODEL,
                        "memory_mb": DEMO_GPU_MEMORY_MB,
                    },
                )
            if name == DEMO_NODES[-1]:
                # The debug queue's shared slots: two debug jobs can run on this GPU at once.
                from cluster.services import gpu_set_shared_slots

                shared = Gpu.objects.get(uuid=simulated_gpu_uuid(name, DEMO_GPUS_PER_NODE - 1))
                if shared.shared_slots != DEMO_SHARED_SLOTS:
                    gpu_set_shared_slots(gpu_id=shared.pk, slots=DEMO_SHARED_SLOTS)
            NodeToken.objects.filter(node_name=name, name="demo").delete()
            _token, secret = NodeToken.issue(node_name=name, name="demo")
            agents.append({"name": name, "token": secret, "gpus": DEMO_GPUS_PER_NODE})
        # Members start the demo with this month's grant (beat would give it within the hour).
        from accounts.services import credits_monthly_grant

        credits_monthly_grant()
        path = settings.VAR_DIR / "demo-agents.json"
        path.write_text(json.dumps(agents, indent=2))
        path.chmod(0o600)
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo lab ready: admin, alice, bob, charlie (password {DEMO_PASSWORD!r}); "
                f"nodes {', '.join(DEMO_NODES)} with {DEMO_GPUS_PER_NODE} simulated GPUs each."
            )
        )

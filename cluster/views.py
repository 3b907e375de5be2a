from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from cluster.models import Gpu, Node


def nodes_with_gpus() -> list[Node]:
    """Every node with its GPUs, for the dashboard and the live GPU table."""
    return list(
        Node.objects.prefetch_related(
            Prefetch("gpus", queryset=Gpu.objects.order_by("index", "kind", "uuid"))
        )
    )


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    nodes = nodes_with_gpus()
    return render(
        request,
        "cluster/dashboard.html",
        {
            "nodes": nodes,
            "gpu_count": sum(1 for n in nodes for g in n.gpus.all() if g.kind == Gpu.Kind.WHOLE),
        },
    )


@login_required
def gpu_table(request: HttpRequest) -> HttpResponse:
    """The live GPU table, refreshed by htmx."""
    return render(request, "cluster/_gpu_table.html", {"nodes": nodes_with_gpus()})

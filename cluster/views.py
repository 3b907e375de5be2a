from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from cluster.models import Gpu, Node
from cluster.selectors import nodes_for_live_page
from cluster.services import node_set_drain

GPU_PAGE_RANGES = {"24h": gettext_lazy("24 hours"), "7d": gettext_lazy("7 days")}


@login_required
def gpu_live(request: HttpRequest) -> HttpResponse:
    """The GPUs page: every GPU with its latest reading, and charts of the last 24 hours or 7 days."""
    nodes = nodes_for_live_page()
    chosen = request.GET.get("range", "24h")
    return render(
        request,
        "cluster/dashboard.html",
        {
            "nodes": nodes,
            "gpu_count": sum(1 for n in nodes for row in n.gpus if row.gpu.kind == Gpu.Kind.WHOLE),
            "range": chosen if chosen in GPU_PAGE_RANGES else "24h",
            "ranges": list(GPU_PAGE_RANGES.items()),
        },
    )


@login_required
def gpu_table(request: HttpRequest) -> HttpResponse:
    """The live GPU table, refreshed by htmx."""
    return render(request, "cluster/_gpu_table.html", {"nodes": nodes_for_live_page()})


@require_POST
@login_required
def node_drain(request: HttpRequest, name: str) -> HttpResponse:
    """Staff drain a node (drain=1) or return it to service (drain=0)."""
    if not request.user.is_staff:
        raise PermissionDenied
    node = get_object_or_404(Node, name=name)
    choice = request.POST.get("drain")
    if choice not in ("0", "1"):
        return HttpResponseBadRequest(
            _("Say drain=1 to drain the node or drain=0 to return it to service.")
        )
    node = node_set_drain(node_id=node.pk, drain=choice == "1")
    if request.htmx:  # type: ignore[attr-defined]
        return gpu_table(request)
    if node.drain_requested:
        messages.success(
            request,
            _("Node %(node)s is draining: its running jobs finish, nothing new starts there.")
            % {"node": node.name},
        )
    else:
        messages.success(request, _("Node %(node)s is back in service.") % {"node": node.name})
    return redirect("gpu_live")

"""Node management: drain, registration, heartbeats and liveness."""

from __future__ import annotations

from django.db import transaction

from cluster.models import Node


@transaction.atomic
def node_set_drain(*, node_id: int, drain: bool) -> Node:
    """Drain a node (running jobs finish, nothing new starts) or return it to service."""
    node = Node.objects.select_for_update().get(pk=node_id)
    node.drain_requested = drain
    if drain and node.state == Node.State.UP:
        node.state = Node.State.DRAINING
    elif not drain and node.state == Node.State.DRAINING:
        node.state = Node.State.UP
    node.save(update_fields=["drain_requested", "state"])
    return node

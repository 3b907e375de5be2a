"""/metrics: the collectors each app registers in its AppConfig.ready(), in one registry
that prometheus-client's `generate_latest` writes out (ops/views.py).

Kept here, at the bottom layer and without any app import, so that any app may
contribute a collector (telemetry: the portal's state; ops: the backups) without
importing the app that serves /metrics (ops/views.py). Collectors are scraped in the
order they were registered, which is INSTALLED_APPS order.
"""

from __future__ import annotations

from prometheus_client.registry import Collector, CollectorRegistry

_collectors: list[Collector] = []


def register_collector(collector: Collector) -> None:
    """Add `collector` to what /metrics scrapes (once: registering it again does nothing)."""
    if not any(c is collector for c in _collectors):
        _collectors.append(collector)


def registered_collectors() -> list[Collector]:
    """The registered collectors, in the order they were registered."""
    return list(_collectors)


def metrics_registry() -> CollectorRegistry:
    """A registry of every collector registered so far (call it once the apps are ready)."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in registered_collectors():
        registry.register(collector)
    return registry

"""/metrics: the collectors each app registers in its AppConfig.ready(), and their
exposition in the Prometheus text format.

Kept here, at the bottom layer and without any app import, so that any app may
contribute a collector (telemetry: the portal's state; ops: the backups) without
importing the app that serves /metrics (ops/views.py). Collectors are scraped in the
order they were registered, which is INSTALLED_APPS order.
"""

from __future__ import annotations

from prometheus_client.openmetrics.exposition import (
    UNDERSCORES,
    escape_label_name,
    escape_metric_name,
)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

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


# Rendered label sets ('{gpu="0",node="gpu01",…}'), kept from one scrape to the next.
_label_strings: dict[tuple[tuple[str, str], ...], str] = {}
_LABEL_STRINGS_KEPT = 100_000
# prometheus-client's names for OpenMetrics-only types, in the text format 0.0.4.
_TEXT_TYPES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram"}
_OPENMETRICS_SUFFIXES = ("_created", "_gsum", "_gcount")


def metrics_text(registry: CollectorRegistry) -> bytes:
    """The registry in the Prometheus text format, byte for byte as `generate_latest` writes it.

    `generate_latest` escapes and validates every label of every sample; a lab's
    GPU metrics repeat one label set per GPU across a dozen families, and the same
    sets from one scrape to the next, so here each label set is rendered once and
    kept (up to `_LABEL_STRINGS_KEPT` of them).
    """
    label_strings = _label_strings
    if len(label_strings) > _LABEL_STRINGS_KEPT:
        label_strings.clear()  # holders change; never let old sets pile up
    names: dict[str, str] = {}

    def line(sample: Sample) -> str:
        labels = ""
        if sample.labels:
            key = tuple(sample.labels.items())
            labels = label_strings.get(key, "")
            if not labels:
                labels = label_strings[key] = _label_string(sample.labels)
        name = names.get(sample.name, "")
        if not name:
            name = names[sample.name] = escape_metric_name(sample.name, UNDERSCORES)
        stamp = "" if sample.timestamp is None else f" {int(float(sample.timestamp) * 1000):d}"
        return f"{name}{labels} {floatToGoString(sample.value)}{stamp}\n"

    output: list[str] = []
    for metric in registry.collect():
        name, kind = metric.name, metric.type
        if kind == "counter":
            name += "_total"
        elif kind == "info":
            name += "_info"
        kind = "untyped" if kind == "unknown" else _TEXT_TYPES.get(kind, kind)
        output.append(_header(name, metric.documentation, kind))
        extra: dict[str, list[str]] = {}
        for sample in metric.samples:
            suffix = sample.name[len(metric.name) :]
            if sample.name.startswith(metric.name) and suffix in _OPENMETRICS_SUFFIXES:
                extra.setdefault(suffix, []).append(line(sample))
            else:
                output.append(line(sample))
        for suffix, lines in sorted(extra.items()):
            output.append(_header(metric.name + suffix, metric.documentation, "gauge"))
            output.extend(lines)
    return "".join(output).encode("utf-8")


def _header(name: str, documentation: str, kind: str) -> str:
    escaped = escape_metric_name(name, UNDERSCORES)
    text = documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {escaped} {text}\n# TYPE {escaped} {kind}\n"


def _label_value(value: str) -> str:
    """A label value escaped as prometheus-client escapes it (backslash, newline, quote)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _label_string(labels: dict[str, str]) -> str:
    pairs = (
        f'{escape_label_name(k, UNDERSCORES)}="{_label_value(v)}"'
        for k, v in sorted(labels.items())
    )
    return "{" + ",".join(pairs) + "}"

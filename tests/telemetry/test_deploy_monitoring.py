"""deploy/monitoring/ checked for real: promtool on the config and rules, every dashboard query
against what the exporter and the rules define, and a real Prometheus scraping a running portal."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster.models import Gpu
from jobqueue.models import Allocation
from telemetry.metrics import PortalCollector
from telemetry.models import ScrapeToken
from telemetry.tasks import samples_ingest
from tests.cluster.conftest import job_on
from tests.conftest import require_in_ci
from tests.telemetry.test_ingest import a_sample

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
DASHBOARDS = sorted((MONITORING / "grafana" / "dashboards").glob("*.json"))
PROMETHEUS_PORT = 9391  # this checkout's port for a test Prometheus

# PromQL words that are not metric names.
KEYWORDS = {
    "and",
    "or",
    "unless",
    "bool",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "inf",
    "nan",
}
_IDENTIFIER = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """The metric and recording-rule names a PromQL expression reads."""
    label_values = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", expr, re.S)
    if label_values:  # Grafana's variable query: label_values(<selector>, <label>)
        expr = label_values.group(1)
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\b\d+(\.\d+)?([eE][-+]?\d+)?\b", " ", expr)
    names = set()
    for match in _IDENTIFIER.finditer(expr):
        name, call = match.groups()
        if call is None and name.lower() not in KEYWORDS:
            names.add(name)
    return names


def dashboard_queries(node: Any) -> Iterator[str]:
    """Every PromQL expression in a dashboard: panel targets and variable queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            elif key == "query" and isinstance(value, dict) and "query" in value:
                yield value["query"]
            else:
                yield from dashboard_queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from dashboard_queries(item)


def recording_rules() -> dict[str, str]:
    rules = yaml.safe_load((MONITORING / "labportal-rules.yml").read_text())
    return {rule["record"]: rule["expr"] for group in rules["groups"] for rule in group["rules"]}


def exported_names() -> set[str]:
    """Every series name the exporter writes, with the suffixes of counters and histograms."""
    suffixes = {
        "counter": ["_total"],
        "histogram": ["_bucket", "_sum", "_count"],
        "info": ["_info"],
    }
    names = set()
    for family in PortalCollector().collect():
        for suffix in suffixes.get(family.type, [""]):
            names.add(family.name + suffix)
    return names


_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")


def selected_labels(expr: str) -> dict[str, set[str]]:
    """The labels each selector of a PromQL expression matches on, per metric name."""
    label_values = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", expr, re.S)
    if label_values:
        expr = label_values.group(1)
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    found: dict[str, set[str]] = {}
    for name, matchers in _SELECTOR.findall(expr):
        found.setdefault(name, set()).update(_MATCHER.findall(matchers))
    return found


def exported_labels(registered_node: Any, alice: Any) -> dict[str, set[str]]:
    """The labels of every series the exporter writes, with a GPU held by a job."""
    node, secret = registered_node
    Allocation.objects.create(job=job_on(node, alice), gpu=Gpu.objects.get(uuid="GPU-aaa"))
    samples_ingest(
        "gpu01", secret, [a_sample("GPU-aaa", ecc_errors=1, xid_errors=1), a_sample("GPU-bbb")]
    )
    labels: dict[str, set[str]] = {}
    for family in PortalCollector().collect():
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    return labels


def test_the_metric_name_check_catches_a_name_nobody_defines() -> None:
    expr = (
        'sum by (node) (rate(labportal_gpu_nonexistent_total{node="$node", job!=""}[5m]))'
        " / on (node) group_left (model) lab:gpus:count > bool 0.5"
    )
    assert metric_names(expr) == {"labportal_gpu_nonexistent_total", "lab:gpus:count"}
    assert metric_names('label_values(labportal_gpu_info{node="$node"}, uuid)') == {
        "labportal_gpu_info"
    }
    assert metric_names("histogram_quantile(0.9, sum by (le) (x_bucket)) or vector(0)") == {
        "x_bucket"
    }


@pytest.mark.django_db
def test_every_dashboard_and_rule_names_only_exported_metrics_or_rules() -> None:
    known = exported_names() | set(recording_rules())
    assert {"labportal_gpu_utilization_ratio", "labportal_job_wait_seconds_bucket"} <= known
    assert len(DASHBOARDS) == 4
    unknown = {}
    for dashboard in DASHBOARDS:
        queries = list(dashboard_queries(json.loads(dashboard.read_text())))
        assert queries, dashboard.name
        for query in queries:
            if missing := metric_names(query) - known:
                unknown[f"{dashboard.name}: {query}"] = missing
    for record, expr in recording_rules().items():
        if missing := metric_names(expr) - known:
            unknown[f"rule {record}: {expr}"] = missing
    assert unknown == {}


def test_the_label_check_catches_a_label_a_series_does_not_have() -> None:
    expr = (
        'labportal_gpu_utilization_ratio{node="$node", job_id!=""} * on (node, gpu) '
        'group_left (job_id, user) labportal_gpu_job_info{user=~"a.*"}'
    )
    assert selected_labels(expr) == {
        "labportal_gpu_utilization_ratio": {"node", "job_id"},
        "labportal_gpu_job_info": {"user"},
    }


@pytest.mark.django_db
def test_every_dashboard_and_rule_selects_only_labels_the_series_have(
    registered_node: Any, alice: Any
) -> None:
    labels = exported_labels(registered_node, alice)
    assert labels["labportal_gpu_utilization_ratio"] == {"node", "gpu", "model"}
    assert labels["labportal_gpu_job_info"] == {"node", "gpu", "job_id", "user"}
    rule_labels = {
        "user:gpus_allocated:count": {"user"},
        "user:gpu_utilization:mean": {"user"},
        "node:gpu_utilization:mean": {"node"},
        "node:gpu_memory_used:ratio": {"node"},
    }
    wrong = {}
    queries = [q for d in DASHBOARDS for q in dashboard_queries(json.loads(d.read_text()))]
    for query in [*queries, *recording_rules().values()]:
        for name, used in selected_labels(query).items():
            have = labels.get(name, rule_labels.get(name, set()))
            if missing := used - have:
                wrong[query] = (name, missing)
    assert wrong == {}
    # The holder is read through the info series, joined on where the GPU is.
    rules = recording_rules()
    assert "group_left (job_id, user) labportal_gpu_job_info" in rules["user:gpu_utilization:mean"]
    assert "labportal_gpu_job_info" in rules["lab:gpus_allocated_idle:count"]


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        require_in_ci("promtool (Debian package prometheus)")
    assert promtool is not None
    return promtool


def test_promtool_accepts_the_scrape_config_and_the_rules(tmp_path: Path) -> None:
    promtool = _promtool()
    token_file = tmp_path / "token"
    token_file.write_text("lpm_example\n")
    config = (MONITORING / "prometheus.yml").read_text()
    assert "/etc/prometheus/labportal-scrape-token" in config
    (tmp_path / "prometheus.yml").write_text(
        config.replace("/etc/prometheus/labportal-scrape-token", str(token_file))
    )
    shutil.copy(MONITORING / "labportal-rules.yml", tmp_path)

    for args in (
        ["check", "config", str(tmp_path / "prometheus.yml")],
        ["check", "rules", str(MONITORING / "labportal-rules.yml")],
    ):
        checked = subprocess.run([promtool, *args], capture_output=True, timeout=60, text=True)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "SUCCESS" in checked.stdout + checked.stderr


def _query(query: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{PROMETHEUS_PORT}/api/v1/query?" + urllib.parse.urlencode(
        {"query": query}
    )
    with urllib.request.urlopen(url, timeout=5) as response:
        answer = json.load(response)
    assert answer["status"] == "success", answer
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_real_prometheus_scrapes_the_portal(
    tmp_path: Path, live_server: Any, registered_node: Any, alice: Any
) -> None:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        require_in_ci("prometheus (Debian package prometheus)")
    assert prometheus is not None
    node, secret = registered_node
    job = job_on(node, alice)
    Allocation.objects.create(job=job, gpu=Gpu.objects.get(uuid="GPU-aaa"))
    samples_ingest("gpu01", secret, [a_sample("GPU-aaa", util_pct=42.0)])
    _token, scrape_secret = ScrapeToken.issue(name="test prometheus")
    (tmp_path / "token").write_text(scrape_secret)
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    config["global"]["scrape_interval"] = "1s"
    config["global"]["evaluation_interval"] = "1s"
    job_config = config["scrape_configs"][0]
    job_config["scheme"] = "http"
    job_config["authorization"]["credentials_file"] = str(tmp_path / "token")
    job_config["static_configs"] = [{"targets": [live_server.url.removeprefix("http://")]}]
    config["rule_files"] = [str(MONITORING / "labportal-rules.yml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", PROMETHEUS_PORT)) == 0:
            pytest.fail(f"port {PROMETHEUS_PORT} is taken; stop what listens there")

    server = subprocess.Popen(
        [
            prometheus,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
    )
    try:
        series: list[dict[str, Any]] = []
        rule: list[dict[str, Any]] = []
        joined: list[dict[str, Any]] = []
        per_user: list[dict[str, Any]] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (series and rule and joined and per_user):
            time.sleep(1)
            if server.poll() is not None:
                break
            try:
                series = _query('labportal_gpu_utilization_ratio{node="gpu01", gpu="0"}')
                rule = _query("lab:gpus_allocated:count")
                joined = _query(
                    "labportal_gpu_utilization_ratio * on (node, gpu) group_left (job_id, user)"
                    " labportal_gpu_job_info"
                )
                per_user = _query("user:gpus_allocated:count")
            except OSError:
                continue
        log = (tmp_path / "prometheus.log").read_text()
        assert series, f"Prometheus never got the GPU metric; its log:\n{log[-3000:]}"
    finally:
        server.terminate()
        server.wait(timeout=30)

    labels = series[0]["metric"]
    assert labels["node"] == "gpu01"
    assert labels["gpu"] == "0"
    assert "user" not in labels and "job_id" not in labels  # per-job detail: the info series
    assert labels["job"] == "labportal"  # the scrape job, untouched
    assert float(series[0]["value"][1]) == pytest.approx(0.42)
    assert rule and float(rule[0]["value"][1]) == 1
    # The join the dashboards use names the holding job and its owner.
    assert [(j["metric"]["job_id"], j["metric"]["user"]) for j in joined] == [
        (str(job.pk), "alice")
    ]
    assert float(joined[0]["value"][1]) == pytest.approx(0.42)
    assert [(u["metric"]["user"], float(u["value"][1])) for u in per_user] == [("alice", 1.0)]

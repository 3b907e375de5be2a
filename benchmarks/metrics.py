"""/metrics on PostgreSQL: prometheus-client's writer against a hand-written one, and the
number of series a lab leaves in Prometheus as jobs come and go.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/labportal python -m benchmarks.metrics \
        [--gpus 1024] [--rounds 8] [--json]

It creates (and afterwards drops) a database `<name>_metrics_bench` next to the one in
DATABASE_URL, with `--gpus` GPUs (8 per node) and 10,000 waiting jobs, then:

- exposition: the same registry written by `prometheus_client.generate_latest` (what
  /metrics serves) and by the hand-written writer /metrics used before (kept below, only
  as this comparison: it renders each label set once and caches it across scrapes),
  interleaved, 10 times each, with half the GPUs held by running jobs: the whole scrape
  (queries, families and text), and the writing alone (the same families, collected once),
  each with the ratio of the two; the collection alone is timed apart;
- series: `--rounds` rounds, each starting one single-GPU job on every GPU, scraping,
  ending them all and scraping again. After each round it prints the series of one scrape
  and the distinct series seen so far (what Prometheus' head keeps for about two hours,
  and its blocks for the retention), labelled as /metrics labels them now and as it did
  before (every GPU series with the holder's `user` and `job_id`, and `uuid`; worked out
  from the same scrape: the GPU's `uuid` from `labportal_gpu_info`, the holder from
  `labportal_gpu_job_info`, or "" for none, as the former collector wrote them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import (
    UNDERSCORES,
    escape_label_name,
    escape_metric_name,
)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from benchmarks.portal import migrated_bench_database
from benchmarks.telemetry import _lab as telemetry_lab
from benchmarks.telemetry import _median_ms

Series = tuple[str, tuple[tuple[str, str], ...]]


# --- The hand-written writer /metrics used before (the comparison only) -------------------

_label_strings: dict[tuple[tuple[str, str], ...], str] = {}
_TEXT_TYPES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram"}
_OPENMETRICS_SUFFIXES = ("_created", "_gsum", "_gcount")


def handwritten_text(registry: CollectorRegistry) -> bytes:
    """The registry in the text format 0.0.4, byte for byte as `generate_latest` writes it,
    each label set rendered once and kept from one scrape to the next."""
    names: dict[str, str] = {}

    def line(sample: Sample) -> str:
        labels = ""
        if sample.labels:
            key = tuple(sample.labels.items())
            labels = _label_strings.get(key, "")
            if not labels:
                labels = _label_strings[key] = _label_string(sample.labels)
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


def _label_string(labels: dict[str, str]) -> str:
    pairs = (
        f'{escape_label_name(k, UNDERSCORES)}="'
        + v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
        + '"'
        for k, v in sorted(labels.items())
    )
    return "{" + ",".join(pairs) + "}"


# --- Series -------------------------------------------------------------------------------


def scrape_series(registry: CollectorRegistry) -> tuple[set[Series], set[Series]]:
    """One scrape's series: as /metrics labels them, and as it labelled them before."""
    samples = [sample for family in registry.collect() for sample in family.samples]
    uuids: dict[tuple[str, str], str] = {}
    holders: dict[tuple[str, str], tuple[str, str]] = {}
    for s in samples:
        where = (s.labels.get("node", ""), s.labels.get("gpu", ""))
        if s.name == "labportal_gpu_info":
            uuids[where] = s.labels["uuid"]
        elif s.name == "labportal_gpu_job_info":
            holders[where] = (s.labels["user"], s.labels["job_id"])
    now: set[Series] = set()
    before: set[Series] = set()
    for s in samples:
        series = (s.name, tuple(sorted(s.labels.items())))
        now.add(series)
        if s.name == "labportal_gpu_job_info":
            continue  # it did not exist; the holder was on every GPU series instead
        if s.name.startswith("labportal_gpu_") and s.name != "labportal_gpu_info":
            where = (s.labels["node"], s.labels["gpu"])
            user, job_id = holders.get(where, ("", ""))
            labels = {**s.labels, "uuid": uuids[where], "user": user, "job_id": job_id}
            series = (s.name, tuple(sorted(labels.items())))
        before.add(series)
    return now, before


def _count(series: Iterable[Series], prefix: str) -> int:
    return sum(1 for name, _labels in series if name.startswith(prefix))


def _lab(gpus: int, pending: int) -> list[Any]:
    from accounts.models import User
    from cluster.models import Gpu
    from jobqueue.models import ContainerImage, Job, Queue

    telemetry_lab(gpus)
    Gpu.objects.update(
        util_pct=70.0, mem_used_mb=30000, temp_c=60.0, power_w=350.0, sampled_at=datetime.now(UTC)
    )
    users = User.objects.bulk_create(User(username=f"member{i}") for i in range(50))
    queue = Queue.objects.get(name="normal")
    image, _ = ContainerImage.objects.get_or_create(reference="pytorch/pytorch:2.4.0")
    now = datetime.now(UTC)
    Job.objects.bulk_create(
        (
            Job(
                owner=users[i % len(users)],
                queue=queue,
                image=image,
                command=["python", "train.py"],
                time_limit_s=3600,
                state=Job.State.PENDING,
                submitted_at=now - timedelta(minutes=i % 600),
            )
            for i in range(pending)
        ),
        batch_size=2000,
    )
    return users


def _start_round(users: list[Any], gpu_ids: list[int], first: int, share: float = 1.0) -> None:
    """One single-GPU job running on each of the first `share` of the GPUs."""
    from cluster.models import Gpu
    from jobqueue.models import Allocation, ContainerImage, Job, Queue

    queue = Queue.objects.get(name="normal")
    image = ContainerImage.objects.get(reference="pytorch/pytorch:2.4.0")
    now = datetime.now(UTC)
    held = gpu_ids[: int(len(gpu_ids) * share)]
    Gpu.objects.update(sampled_at=now)  # current readings, however long the run takes
    jobs = Job.objects.bulk_create(
        Job(
            owner=users[(first + i) % len(users)],
            queue=queue,
            image=image,
            command=["python", "train.py"],
            time_limit_s=3600,
            state=Job.State.RUNNING,
            submitted_at=now - timedelta(minutes=5),
            started_at=now,
        )
        for i in range(len(held))
    )
    Allocation.objects.bulk_create(
        Allocation(job=job, gpu_id=gpu_id) for job, gpu_id in zip(jobs, held, strict=True)
    )


def _end_round() -> None:
    from jobqueue.models import Allocation, Job

    Allocation.objects.filter(active=True).update(active=False)
    Job.objects.filter(state=Job.State.RUNNING).update(
        state=Job.State.COMPLETED, ended_at=datetime.now(UTC)
    )


def _timeless(text: bytes) -> list[bytes]:
    """The exposition without the ages, which move between two scrapes."""
    return [line for line in text.splitlines() if b"_age_seconds{" not in line]


class _Replay(Collector):
    """One scrape's families again, so that a writer is timed without the queries."""

    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)


def bench_exposition(registry: CollectorRegistry, repeat: int = 10) -> dict[str, float]:
    from prometheus_client import generate_latest

    assert _timeless(handwritten_text(registry)) == _timeless(generate_latest(registry))
    collected = CollectorRegistry(auto_describe=False)
    collected.register(_Replay(list(registry.collect())))
    times: dict[str, list[float]] = {key: [] for key in ("client", "ours", "client_w", "ours_w")}
    for _ in range(repeat):  # interleaved: load from elsewhere weighs on all alike
        times["client"].append(_median_ms(lambda: generate_latest(registry), 1))
        times["ours"].append(_median_ms(lambda: handwritten_text(registry), 1))
        times["client_w"].append(_median_ms(lambda: generate_latest(collected), 1))
        times["ours_w"].append(_median_ms(lambda: handwritten_text(collected), 1))
    ms = {key: statistics.median(values) for key, values in times.items()}
    return {
        "bytes": len(generate_latest(registry)),
        "scrape_generate_latest_ms": round(ms["client"], 1),
        "scrape_handwritten_ms": round(ms["ours"], 1),
        "scrape_ratio": round(ms["client"] / ms["ours"], 2),
        "writing_only_generate_latest_ms": round(ms["client_w"], 1),
        "writing_only_handwritten_ms": round(ms["ours_w"], 1),
        "writing_only_ratio": round(ms["client_w"] / ms["ours_w"], 2),
        "collect_only_ms": round(_median_ms(lambda: list(registry.collect()), repeat), 1),
    }


def bench_series(
    registry: CollectorRegistry, users: list[Any], gpu_ids: list[int], rounds: int, report: bool
) -> list[dict[str, int]]:
    seen_now: set[Series] = set()
    seen_before: set[Series] = set()
    rows: list[dict[str, int]] = []
    jobs = 0
    for number in range(rounds + 1):
        if number:
            _start_round(users, gpu_ids, jobs)
            jobs += len(gpu_ids)
        now, before = scrape_series(registry)
        seen_now |= now
        seen_before |= before
        if number:
            _end_round()
            ended_now, ended_before = scrape_series(registry)
            seen_now |= ended_now
            seen_before |= ended_before
        row = {
            "jobs_run": jobs,
            "scrape_series_before": len(before),
            "scrape_series_now": len(now),
            "distinct_series_before": len(seen_before),
            "distinct_series_now": len(seen_now),
            "distinct_gpu_series_now": _count(seen_now, "labportal_gpu_")
            - _count(seen_now, "labportal_gpu_job_info"),
            "distinct_job_info_series_now": _count(seen_now, "labportal_gpu_job_info"),
        }
        rows.append(row)
        if report:
            print("series:", row, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=8, help="rounds of one job per GPU")
    args = parser.parse_args(argv)
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        print("benchmarks.metrics needs DATABASE_URL=postgres://…", file=sys.stderr)
        return 2
    with migrated_bench_database(url, "metrics_bench"):
        from cluster.models import Gpu
        from core.metrics import metrics_registry

        users = _lab(args.gpus, args.pending)
        gpu_ids = list(Gpu.objects.order_by("pk").values_list("pk", flat=True))
        registry = metrics_registry()  # what /metrics serves
        _start_round(users, gpu_ids, 0, share=0.5)
        figures: dict[str, Any] = {"gpus": len(gpu_ids), "pending_jobs": args.pending}
        figures["exposition"] = bench_exposition(registry)
        _end_round()
        if not args.json:
            lab = {k: v for k, v in figures.items() if k != "exposition"}
            print("exposition:", {**lab, **figures["exposition"]}, flush=True)
        figures["series"] = bench_series(registry, users, gpu_ids, args.rounds, not args.json)
    if args.json:
        print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

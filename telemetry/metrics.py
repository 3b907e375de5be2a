"""The portal's collector of /metrics: it reads the portal's current state.

Registered in TelemetryConfig.ready(); core/metrics.py renders the exposition and
ops/views.py serves it.

A scrape costs a fixed handful of queries whatever the size of the lab (GPUs with
their latest ECC/XID reading, allocations, nodes, jobs per queue, waits, credits,
reservations, stored histograms, rejected agent messages); it never reads samples one by one. Member balances
stay out: credits are totals per category.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import (
    Case,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    Subquery,
    Sum,
    When,
)
from django.utils import timezone
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from accounts.models import LedgerEntry
from cluster.models import Gpu, Node, RejectedMessage
from jobqueue.models import Allocation, Job, Queue
from reservations.models import Reservation
from telemetry.models import GpuSample, ObservedHistogram

MIB = 1024 * 1024
# A GPU's series are named by where it is (and what it is) only: they live as long as the
# GPU does. The job holding it, and its owner, are in labportal_gpu_job_info, one series
# per GPU while the job runs; "job" is Prometheus' own target label, hence "job_id".
GPU_LABELS = ["node", "gpu", "model"]
# Seconds; a scheduling pass is tens of milliseconds to seconds.
SCHEDULING_PASS_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]
SCHEDULING_PASS = "scheduling_pass_duration_seconds"
# Seconds from submit to start: a minute to a week.
WAIT_BUCKETS = [
    60,
    300,
    900,
    1800,
    3600,
    3 * 3600,
    6 * 3600,
    12 * 3600,
    86400,
    3 * 86400,
    7 * 86400,
]
GRANTED_KINDS = (LedgerEntry.Kind.GRANT, LedgerEntry.Kind.REWARD)
SPENT_KINDS = (LedgerEntry.Kind.CHARGE, LedgerEntry.Kind.RESERVATION, LedgerEntry.Kind.NO_SHOW)


def histogram_observe(*, name: str, value: float, bounds: list[float]) -> None:
    """Count one observation of `value` in the stored histogram `name` (made on first use)."""
    with transaction.atomic():
        histogram, _created = ObservedHistogram.objects.select_for_update().get_or_create(
            name=name, defaults={"bounds": bounds, "counts": [0] * len(bounds)}
        )
        histogram.counts = [
            count + (1 if value <= bound else 0)
            for count, bound in zip(histogram.counts, histogram.bounds, strict=True)
        ]
        histogram.total += value
        histogram.count += 1
        histogram.save(update_fields=["counts", "total", "count"])


class PortalCollector(Collector):
    """Collects every labportal_* metric from the database at scrape time."""

    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        yield from self._gpus(now)
        yield from self._nodes(now)
        yield from self._queues()
        yield from self._scheduler()
        yield from self._credits()
        yield from self._rejections()

    # --- GPUs ---------------------------------------------------------------

    def _gpus(self, now: datetime) -> Iterator[Metric]:
        stale_before = now - timedelta(seconds=settings.LABPORTAL_NODE_DOWN_AFTER_S)
        # Ordered like the (gpu, ts) unique index, and bounded in time, so each GPU's
        # latest row is one index probe (ordering by ts alone lets PostgreSQL walk the
        # ts index across every GPU's rows for a GPU that has none).
        latest = GpuSample.objects.filter(gpu=OuterRef("pk"), ts__gte=stale_before).order_by(
            "-gpu_id", "-ts"
        )
        gpus = (
            Gpu.objects.values(
                "pk",
                "index",
                "uuid",
                "model",
                "kind",
                "state",
                "memory_mb",
                "util_pct",
                "mem_used_mb",
                "temp_c",
                "power_w",
                "sampled_at",
                "node__name",
            )
            .annotate(
                ecc=Subquery(latest.values("ecc_errors")[:1]),
                xid=Subquery(latest.values("xid_errors")[:1]),
            )
            # At each position, the GPU the node reports before one it no longer does:
            # a GPU that replaced a missing one keeps the plain `gpu` label.
            .order_by(
                "node__name",
                "index",
                Case(When(state=Gpu.State.MISSING, then=1), default=0),
                "uuid",
            )
        )
        holders = {
            gpu_id: (username, str(job_id))
            for gpu_id, job_id, username in Allocation.objects.filter(active=True).values_list(
                "gpu_id", "job_id", "job__owner__username"
            )
        }
        info = GaugeMetricFamily(
            "labportal_gpu_info",
            "A schedulable GPU unit (whole GPU, MIG instance or shared slot); always 1.",
            labels=["node", "gpu", "uuid", "model", "kind"],
        )
        holder = InfoMetricFamily(
            "labportal_gpu_job",
            "The job that holds the GPU now, and its owner; only while a job holds it. "
            "Join: * on (node, gpu) group_left (job_id, user) labportal_gpu_job_info.",
            labels=["node", "gpu"],
        )
        allocated = GaugeMetricFamily(
            "labportal_gpu_allocated", "1 while a job holds the GPU, else 0.", labels=GPU_LABELS
        )
        util = GaugeMetricFamily(
            "labportal_gpu_utilization_ratio",
            "GPU utilisation as reported by NVML, from 0 to 1.",
            labels=GPU_LABELS,
        )
        mem_used = GaugeMetricFamily(
            "labportal_gpu_memory_used_bytes", "GPU memory in use.", labels=GPU_LABELS
        )
        mem_total = GaugeMetricFamily(
            "labportal_gpu_memory_total_bytes", "GPU memory in total.", labels=GPU_LABELS
        )
        temp = GaugeMetricFamily(
            "labportal_gpu_temperature_celsius", "GPU temperature.", labels=GPU_LABELS
        )
        power = GaugeMetricFamily("labportal_gpu_power_watts", "GPU power draw.", labels=GPU_LABELS)
        ecc = CounterMetricFamily(
            "labportal_gpu_ecc_errors",
            "ECC errors the driver counted on this GPU.",
            labels=GPU_LABELS,
        )
        xid = CounterMetricFamily(
            "labportal_gpu_xid_errors",
            "XID errors the driver reported on this GPU.",
            labels=GPU_LABELS,
        )
        age = GaugeMetricFamily(
            "labportal_gpu_sample_age_seconds",
            "Seconds since the GPU's latest reading.",
            labels=GPU_LABELS,
        )
        taken: set[tuple[str, str]] = set()
        for gpu in gpus:
            node = gpu["node__name"]
            position = gpu_position(gpu["index"], gpu["kind"], gpu["uuid"])
            if (node, position) in taken:
                # A GPU the node no longer reports, whose place a reported one took.
                position = f"{position}/{gpu['uuid']}"
            taken.add((node, position))
            labels = [node, position, gpu["model"]]
            info.add_metric([node, position, gpu["uuid"], gpu["model"], gpu["kind"]], 1)
            held = holders.get(gpu["pk"])
            if held is not None:
                holder.add_metric([node, position], {"job_id": held[1], "user": held[0]})
            allocated.add_metric(labels, 0 if held is None else 1)
            mem_total.add_metric(labels, gpu["memory_mb"] * MIB)
            sampled_at = gpu["sampled_at"]
            if sampled_at is None:
                continue
            age.add_metric(labels, max(0.0, (now - sampled_at).total_seconds()))
            if sampled_at < stale_before:
                continue  # a silent GPU has no current reading; Prometheus marks it absent
            _add(util, labels, gpu["util_pct"], scale=0.01)
            _add(mem_used, labels, gpu["mem_used_mb"], scale=MIB)
            _add(temp, labels, gpu["temp_c"])
            _add(power, labels, gpu["power_w"])
            _add(ecc, labels, gpu["ecc"])
            _add(xid, labels, gpu["xid"])
        yield from (info, holder, allocated, util, mem_used, mem_total, temp, power, ecc, xid, age)

    # --- Nodes --------------------------------------------------------------

    def _nodes(self, now: datetime) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "labportal_node_up", "1 while the node's agent is heard from, else 0.", labels=["node"]
        )
        draining = GaugeMetricFamily(
            "labportal_node_draining",
            "1 while an admin drains the node (running jobs finish, nothing new starts).",
            labels=["node"],
        )
        heartbeat = GaugeMetricFamily(
            "labportal_node_heartbeat_age_seconds",
            "Seconds since the node's last heartbeat.",
            labels=["node"],
        )
        info = GaugeMetricFamily(
            "labportal_node_info",
            "The node's agent: GPU backend (simulated or nvml), runtime and version; always 1.",
            labels=["node", "backend", "runtime", "agent_version"],
        )
        for node in Node.objects.values(
            "name",
            "state",
            "drain_requested",
            "last_heartbeat",
            "gpu_backend",
            "runtime",
            "agent_version",
        ):
            name = node["name"]
            up.add_metric([name], 0 if node["state"] == Node.State.DOWN else 1)
            draining.add_metric([name], 1 if node["drain_requested"] else 0)
            if node["last_heartbeat"] is not None:
                heartbeat.add_metric(
                    [name], max(0.0, (now - node["last_heartbeat"]).total_seconds())
                )
            info.add_metric([name, node["gpu_backend"], node["runtime"], node["agent_version"]], 1)
        yield from (up, draining, heartbeat, info)

    # --- Queues and scheduler ----------------------------------------------

    def _queues(self) -> Iterator[Metric]:
        families = {
            "pending_jobs": GaugeMetricFamily(
                "labportal_queue_pending_jobs", "Jobs waiting (pending or held).", labels=["queue"]
            ),
            "pending_gpus": GaugeMetricFamily(
                "labportal_queue_pending_gpus", "GPUs the waiting jobs ask for.", labels=["queue"]
            ),
            "running_jobs": GaugeMetricFamily(
                "labportal_queue_running_jobs",
                "Jobs dispatched or running.",
                labels=["queue"],
            ),
            "running_gpus": GaugeMetricFamily(
                "labportal_queue_running_gpus", "GPUs the running jobs hold.", labels=["queue"]
            ),
        }
        totals: dict[str, dict[str, float]] = {}
        rows = (
            Job.objects.filter(state__in=[*Job.WAITING_STATES, *Job.ACTIVE_STATES])
            .values("queue__name", "state")
            .annotate(jobs=Count("pk"), gpus=Sum("gpus"))
        )
        for name in Queue.objects.values_list("name", flat=True):
            totals[name] = dict.fromkeys(families, 0.0)
        for row in rows:
            kind = "pending" if row["state"] in Job.WAITING_STATES else "running"
            queue = totals.setdefault(row["queue__name"], dict.fromkeys(families, 0.0))
            queue[f"{kind}_jobs"] += row["jobs"]
            queue[f"{kind}_gpus"] += row["gpus"] or 0
        for queue_name, values in sorted(totals.items()):
            for key, family in families.items():
                family.add_metric([queue_name], values[key])
        yield from families.values()

    def _scheduler(self) -> Iterator[Metric]:
        stored = ObservedHistogram.objects.filter(name=SCHEDULING_PASS).first()
        bounds = stored.bounds if stored else SCHEDULING_PASS_BUCKETS
        counts = stored.counts if stored else [0] * len(bounds)
        passes = HistogramMetricFamily(
            "labportal_scheduling_pass_duration_seconds",
            "How long each scheduling pass took.",
            buckets=_buckets(bounds, counts, stored.count if stored else 0),
            sum_value=stored.total if stored else 0.0,
        )
        yield passes

        wait = ExpressionWrapper(F("started_at") - F("submitted_at"), output_field=DurationField())
        started = Job.objects.filter(started_at__isnull=False).annotate(wait=wait)
        aggregates: dict[str, Any] = {
            f"le_{i}": Count("pk", filter=Q(wait__lte=timedelta(seconds=bound)))
            for i, bound in enumerate(WAIT_BUCKETS)
        }
        figures = started.aggregate(count=Count("pk"), total=Sum("wait"), **aggregates)
        total_wait: timedelta | None = figures["total"]
        yield HistogramMetricFamily(
            "labportal_job_wait_seconds",
            "Time from submit to start of every job that has started.",
            buckets=_buckets(
                [float(b) for b in WAIT_BUCKETS],
                [figures[f"le_{i}"] for i in range(len(WAIT_BUCKETS))],
                figures["count"],
            ),
            sum_value=max(0.0, total_wait.total_seconds()) if total_wait else 0.0,
        )
        active = GaugeMetricFamily(
            "labportal_reservations_active", "Bookings whose time slot is running now."
        )
        active.add_metric([], Reservation.objects.filter(state=Reservation.State.ACTIVE).count())
        yield active

    # --- Credits ------------------------------------------------------------

    def _credits(self) -> Iterator[Metric]:
        granted = CounterMetricFamily(
            "labportal_credits_granted",
            "Credits granted (monthly grants and efficiency rewards), per user category.",
            labels=["category"],
        )
        spent = CounterMetricFamily(
            "labportal_credits_spent",
            "Credits spent (job charges, bookings and no-shows), per user category.",
            labels=["category"],
        )
        per_category: dict[str, list[Decimal]] = {}
        for row in (
            LedgerEntry.objects.filter(kind__in=[*GRANTED_KINDS, *SPENT_KINDS])
            .values("account__user__category__name", "kind")
            .annotate(amount=Sum("amount"))
        ):
            name = row["account__user__category__name"] or "none"
            sums = per_category.setdefault(name, [Decimal(0), Decimal(0)])
            if row["kind"] in GRANTED_KINDS:
                sums[0] += row["amount"]
            else:
                sums[1] -= row["amount"]  # charges are negative entries
        for name, (given, used) in sorted(per_category.items()):
            granted.add_metric([name], float(max(given, Decimal(0))))
            spent.add_metric([name], float(max(used, Decimal(0))))
        yield from (granted, spent)

    # --- Agent messages -----------------------------------------------------

    def _rejections(self) -> Iterator[Metric]:
        # By reason only: node names and task names in the rows come from the senders.
        rejected = CounterMetricFamily(
            "labportal_agent_messages_rejected",
            "Broker messages refused by the portal or an agent (admin: rejected agent "
            "messages): wrong signatures, malformed or undecodable messages, forged commands.",
            labels=["reason"],
        )
        for row in (
            RejectedMessage.objects.values("reason").annotate(total=Sum("count")).order_by("reason")
        ):
            rejected.add_metric([row["reason"]], row["total"])
        yield rejected


def gpu_position(index: int, kind: str, uuid: str) -> str:
    """The `gpu` label: the index of a whole GPU, `<index>/<kind>-<uuid tail>` for a part."""
    if kind == Gpu.Kind.WHOLE:
        return str(index)
    return f"{index}/{kind}-{uuid[-4:]}"


def _add(
    family: GaugeMetricFamily | CounterMetricFamily,
    labels: list[str],
    value: float | None,
    scale: float = 1.0,
) -> None:
    if value is not None:
        family.add_metric(labels, float(value) * scale)


def _buckets(bounds: Iterable[float], counts: Iterable[int], total: int) -> list[tuple[str, float]]:
    pairs = [
        (floatToGoString(bound), float(count)) for bound, count in zip(bounds, counts, strict=True)
    ]
    return [*pairs, ("+Inf", float(total))]

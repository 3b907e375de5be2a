"""Sample ingestion: the agents' NVML readings into `GpuSample`, and each GPU's latest status."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, F, Field, Model, Q, Value, When
from django.utils import timezone

from cluster import selectors
from cluster.models import Gpu, RejectedMessage
from cluster.protocol import MessageRefused, decode, malformed
from cluster.services import message_reject, node_registered, node_registered_with_gpus
from protocol.messages import MAX_SAMPLES_PER_BATCH, METRICS, Sample, SampleProcess
from telemetry.models import GpuSample
from telemetry.rollups import LATE_WINDOW, rollups_rewind

log = logging.getLogger(__name__)

# A node clock this far ahead is wrong; its samples would shadow the real latest status.
MAX_CLOCK_AHEAD = timedelta(minutes=5)


@dataclass(frozen=True)
class IngestResult:
    stored: int
    rejected: int


@dataclass(frozen=True)
class ParsedSample:
    gpu_uuid: str
    ts: datetime
    metrics: dict[str, Any]
    processes: list[dict[str, Any]]

    @property
    def job_ids(self) -> set[int]:
        return {p["job_id"] for p in self.processes if p["job_id"] is not None}


def samples_ingest(*, node_name: str, samples: object) -> IngestResult:
    """Store a batch of samples from this node and refresh its GPUs' latest status.

    Each sample is judged on its own: a malformed one, or one about a GPU or a job
    that is not this node's, is rejected and logged, and the rest are stored.
    Storing the same batch twice stores it once.
    """
    if not isinstance(samples, list):
        node_registered(node_name=node_name)  # an unregistered node is told that first
        raise malformed(f"samples must be a list, got {type(samples).__name__}")

    refusals: list[tuple[RejectedMessage.Reason, str]] = []
    if len(samples) > MAX_SAMPLES_PER_BATCH:
        refusals.append(
            (
                RejectedMessage.Reason.MALFORMED,
                f"{len(samples) - MAX_SAMPLES_PER_BATCH} samples over the batch limit dropped",
            )
        )
    parsed: list[ParsedSample] = []
    now = timezone.now()
    for position, raw in enumerate(samples[:MAX_SAMPLES_PER_BATCH]):
        try:
            parsed.append(sample_parse(raw, now=now))
        except MessageRefused as exc:
            refusals.append((exc.reason, f"sample {position}: {exc.detail}"))
    # Parsed before the node is looked up, so that the node and its GPUs are one query;
    # nothing is recorded before the node is known to be registered.
    node, gpus = node_registered_with_gpus(node_name=node_name, uuids={s.gpu_uuid for s in parsed})

    def reject(reason: RejectedMessage.Reason, detail: str) -> None:
        message_reject(node_name=node.name, message="samples_ingest", reason=reason, detail=detail)

    for reason, detail in refusals:
        reject(reason, detail)
    jobs_here = selectors.jobs_on_node(
        node_id=node.pk, job_ids={job_id for s in parsed for job_id in s.job_ids}
    )
    accepted: list[tuple[int, ParsedSample]] = []
    for sample in parsed:
        gpu_id = gpus.get(sample.gpu_uuid)
        if gpu_id is None:
            reject(RejectedMessage.Reason.GPU_NOT_ON_NODE, f"GPU {sample.gpu_uuid}")
        elif foreign := sample.job_ids - jobs_here:
            reject(
                RejectedMessage.Reason.JOB_NOT_ON_NODE,
                f"GPU {sample.gpu_uuid} names job(s) {sorted(foreign)}",
            )
        else:
            accepted.append((gpu_id, sample))

    _samples_store(accepted)
    return IngestResult(stored=len(accepted), rejected=len(samples) - len(accepted))


@transaction.atomic(savepoint=False)  # a failure rolls back the whole message (cluster.tasks)
def _samples_store(accepted: list[tuple[int, ParsedSample]]) -> None:
    if not accepted:
        return
    oldest = min(sample.ts for _gpu, sample in accepted)
    if oldest < timezone.now() - LATE_WINDOW:
        # Later than every rollup run's look-back: have those buckets recomputed.
        rollups_rewind(to=oldest)
    newest: dict[int, ParsedSample] = {}
    for gpu_id, sample in accepted:
        if gpu_id not in newest or sample.ts > newest[gpu_id].ts:
            newest[gpu_id] = sample
    if connection.vendor == "postgresql":
        _samples_store_postgresql(accepted, newest)
        return
    GpuSample.objects.bulk_create(
        [
            GpuSample(**dict(zip(_SAMPLE_COLUMNS, row, strict=True)))
            for row in _sample_rows(accepted)
        ],
        ignore_conflicts=True,  # a redelivered batch inserts nothing new
        batch_size=500,
    )
    _gpus_latest_update(newest)


_SAMPLE_COLUMNS = ("gpu_id", "ts", *METRICS, "processes", "job_id")
_LATEST_FIELDS = ("util_pct", "mem_used_mb", "temp_c", "power_w")

# One statement, whatever the batch's size: the samples go in as one array per column
# (a short, constant query text that the driver parses once; the ORM's multi-row
# INSERT costs more to build than to store), and each GPU's latest status moves
# forward only (a late or repeated batch never overwrites a newer reading).
_STORE_SQL = """
WITH stored AS (
    INSERT INTO {sample} ({columns})
    SELECT * FROM unnest({sample_arrays})
    ON CONFLICT (gpu_id, ts) DO NOTHING
)
UPDATE {gpu} AS g SET util_pct = v.util_pct, mem_used_mb = v.mem_used_mb, temp_c = v.temp_c,
    power_w = v.power_w, sampled_at = v.sampled_at
FROM unnest({latest_arrays}) AS v (id, util_pct, mem_used_mb, temp_c, power_w, sampled_at)
WHERE g.id = v.id AND (g.sampled_at IS NULL OR g.sampled_at < v.sampled_at)
"""


def _sample_rows(accepted: list[tuple[int, ParsedSample]]) -> list[tuple[Any, ...]]:
    return [
        (
            gpu_id,
            sample.ts,
            *(sample.metrics[name] for name in METRICS),
            sample.processes,
            next(iter(sample.job_ids)) if len(sample.job_ids) == 1 else None,
        )
        for gpu_id, sample in accepted
    ]


def _column(model: type[Model], name: str) -> Field[Any, Any]:
    field = model._meta.get_field(name)
    assert isinstance(field, Field)
    return field


def _array_casts(model: type[Model], fields: tuple[str, ...]) -> str:
    """`%s::<column type>[]` for each field, e.g. `%s::double precision[]`."""
    return ", ".join(f"%s::{_column(model, f).db_type(connection)}[]" for f in fields)


def _array_literal(values: Iterable[Any]) -> str:
    """A PostgreSQL array literal (`{1,2.5,NULL}`) of numbers, times or JSON documents.

    Each column goes as one text parameter: the driver's own adaptation of a list
    quotes every element in Python, which cost more than the rest of the ingest.
    Numbers and times need no quoting; a JSON document is quoted and escaped as
    the array syntax requires (backslash and double quote), whatever it holds.
    """
    parts = []
    for value in values:
        if value is None:
            parts.append("NULL")
        elif isinstance(value, (int, float)):
            parts.append(repr(value))
        elif isinstance(value, datetime):
            parts.append(f'"{value.isoformat()}"')
        else:
            text = json.dumps(value).replace("\\", "\\\\").replace('"', '\\"')
            parts.append(f'"{text}"')
    return "{" + ",".join(parts) + "}"


@functools.cache
def _store_sql() -> str:
    quote = connection.ops.quote_name
    return _STORE_SQL.format(
        sample=quote(GpuSample._meta.db_table),
        columns=", ".join(quote(c) for c in _SAMPLE_COLUMNS),
        sample_arrays=_array_casts(GpuSample, _SAMPLE_COLUMNS),
        gpu=quote(Gpu._meta.db_table),
        latest_arrays=_array_casts(Gpu, ("id", *_LATEST_FIELDS, "sampled_at")),
    )


def _samples_store_postgresql(
    accepted: list[tuple[int, ParsedSample]], newest: dict[int, ParsedSample]
) -> None:
    sql = _store_sql()
    params = [_array_literal(column) for column in zip(*_sample_rows(accepted), strict=True)]
    latest = list(newest.items())
    params.append(_array_literal(gpu_id for gpu_id, _sample in latest))
    params += [
        _array_literal(sample.metrics[field] for _gpu_id, sample in latest)
        for field in _LATEST_FIELDS
    ]
    params.append(_array_literal(sample.ts for _gpu_id, sample in latest))
    with connection.cursor() as cur:
        cur.execute(sql, params)


def _gpus_latest_update(newest: dict[int, ParsedSample]) -> None:
    """Each GPU's latest status from its newest sample, in one statement (SQLite, the demo).

    Only forward: a late or repeated batch never overwrites a newer reading.
    """
    if not newest:
        return
    # CASEs over the GPUs' ids.
    newer = {
        gpu_id: Q(pk=gpu_id) & (Q(sampled_at__isnull=True) | Q(sampled_at__lt=sample.ts))
        for gpu_id, sample in newest.items()
    }
    values: dict[str, Any] = {}
    for field in (*_LATEST_FIELDS, "sampled_at"):
        output = _column(Gpu, field)
        values[field] = Case(
            *(
                When(
                    newer[gpu_id],
                    then=Value(
                        sample.ts if field == "sampled_at" else sample.metrics[field],
                        output_field=output,
                    ),
                )
                for gpu_id, sample in newest.items()
            ),
            default=F(field),
            output_field=output,
        )
    Gpu.objects.filter(pk__in=newest).update(**values)


def sample_parse(raw: Any, *, now: datetime) -> ParsedSample:
    """Validate one sample of a `samples_ingest` batch (`protocol.messages.Sample`), and
    its time against the portal's clock; raise `MessageRefused` saying what is wrong."""
    sample = decode(Sample, raw)
    try:
        when = datetime.fromtimestamp(sample.ts, tz=UTC)
    except (OverflowError, OSError, ValueError) as exc:
        raise malformed(f"ts {sample.ts!r:.40} is not a time") from exc
    if when > now + MAX_CLOCK_AHEAD:
        raise malformed(f"ts {when.isoformat()} is in the future: check the node's clock (NTP)")
    if when < now - timedelta(seconds=settings.LABPORTAL_REPORT_MAX_AGE_S):
        # As old as no report may be (LABPORTAL_REPORT_MAX_AGE_S): a wrong clock or a replay.
        raise malformed(f"ts {when.isoformat()} is stale: check the node's clock (NTP)")
    return ParsedSample(
        gpu_uuid=sample.gpu_uuid,
        ts=when,
        metrics={name: getattr(sample, name) for name in METRICS},
        processes=[_process(p) for p in sample.processes or ()],
    )


# Which portal job a process reported with an executor's own job id belongs to: the
# executor registers its resolver (slurm/extensions.py: "slurm_job_id").
_process_job_resolvers: dict[str, Callable[[int], int | None]] = {}


def register_process_job_resolver(key: str, resolve: Callable[[int], int | None]) -> None:
    _process_job_resolvers[key] = resolve


def portal_job_for_slurm_job(slurm_job_id: int) -> int | None:
    """The portal job a Slurm job runs (None for a job submitted outside the portal, or
    where no Slurm mode is installed to tell)."""
    resolve = _process_job_resolvers.get("slurm_job_id")
    return resolve(slurm_job_id) if resolve is not None else None


def _process(process: SampleProcess) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "pid": process.pid,
        "used_mb": process.used_mb,
        "container_id": process.container_id,
        "job_id": process.job_id,
    }
    if process.unix_user is not None:  # only a stray's owner is worth the bytes
        entry["unix_user"] = process.unix_user
    if process.slurm_job_id is not None:
        entry["slurm_job_id"] = process.slurm_job_id
        if process.job_id is None:  # Slurm mode: the portal job that Slurm job runs
            entry["job_id"] = portal_job_for_slurm_job(process.slurm_job_id)
    return entry

from __future__ import annotations

import logging
import re
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from cluster.models import Gpu, RejectedMessage
from telemetry.models import GpuSample
from telemetry.tasks import samples_ingest
from tests.cluster.conftest import job_on

pytestmark = pytest.mark.django_db


def a_sample(uuid: str, ts: float | None = None, **overrides: Any) -> dict[str, Any]:
    sample = {
        "gpu_uuid": uuid,
        "ts": ts if ts is not None else time.time(),
        "util_pct": 87.0,
        "mem_used_mb": 40960,
        "mem_total_mb": 81559,
        "temp_c": 66.0,
        "power_w": 512.5,
        "sm_clock_mhz": 1980,
        "ecc_errors": 0,
        "xid_errors": None,
        "processes": [],
    }
    sample.update(overrides)
    return sample


def test_samples_are_stored_in_one_bulk_insert_and_update_the_latest_status(
    registered_node: Any,
) -> None:
    _node, secret = registered_node
    now = time.time()
    batch = [
        a_sample("GPU-aaa", now - 10, util_pct=10.0),
        a_sample("GPU-aaa", now, util_pct=95.0),
        a_sample("GPU-bbb", now, util_pct=None, temp_c=None),
    ]

    with CaptureQueriesContext(connection) as queries:
        assert samples_ingest("gpu01", secret, batch) == "ok"

    inserts = [
        q
        for q in queries.captured_queries
        if re.search(r'INSERT (OR IGNORE )?INTO "telemetry_gpusample"', q["sql"])
    ]
    assert len(inserts) == 1
    assert GpuSample.objects.count() == 3
    aaa = Gpu.objects.get(uuid="GPU-aaa")
    assert (aaa.util_pct, aaa.mem_used_mb, aaa.temp_c, aaa.power_w) == (95.0, 40960, 66.0, 512.5)
    assert aaa.sampled_at == datetime.fromtimestamp(now, tz=UTC)
    bbb = Gpu.objects.get(uuid="GPU-bbb")
    assert (bbb.util_pct, bbb.temp_c) == (None, None)


def test_a_batch_delivered_twice_is_stored_once(registered_node: Any) -> None:
    now = time.time()
    batch = [a_sample("GPU-aaa", now), a_sample("GPU-bbb", now)]

    samples_ingest("gpu01", registered_node[1], batch)
    samples_ingest("gpu01", registered_node[1], batch)

    assert GpuSample.objects.count() == 2


def test_a_late_batch_does_not_overwrite_a_newer_latest_status(registered_node: Any) -> None:
    now = time.time()
    samples_ingest("gpu01", registered_node[1], [a_sample("GPU-aaa", now, util_pct=50.0)])

    samples_ingest("gpu01", registered_node[1], [a_sample("GPU-aaa", now - 60, util_pct=1.0)])

    assert Gpu.objects.get(uuid="GPU-aaa").util_pct == 50.0
    assert GpuSample.objects.count() == 2


def test_one_statement_moves_each_gpus_latest_status_forward_and_leaves_newer_ones(
    registered_node: Any,
) -> None:
    now = time.time()
    samples_ingest("gpu01", registered_node[1], [a_sample("GPU-bbb", now, util_pct=50.0)])
    batch = [
        a_sample("GPU-aaa", now - 20, util_pct=10.0, mem_used_mb=None),
        a_sample("GPU-aaa", now - 10, util_pct=20.0, mem_used_mb=1024, power_w=None),
        a_sample("GPU-bbb", now - 30, util_pct=1.0),  # older than bbb's stored reading
    ]

    with CaptureQueriesContext(connection) as queries:
        assert samples_ingest("gpu01", registered_node[1], batch) == "ok"

    statements = [q["sql"].strip() for q in queries.captured_queries]
    # On PostgreSQL the same statement stores the samples too.
    updates = [sql for sql in statements if re.search(r'UPDATE "?cluster_gpu"? ', sql)]
    assert len(updates) == 1, [sql[:60] for sql in statements]
    aaa = Gpu.objects.get(uuid="GPU-aaa")
    assert (aaa.util_pct, aaa.mem_used_mb, aaa.power_w) == (20.0, 1024, None)
    assert aaa.sampled_at == datetime.fromtimestamp(now - 10, tz=UTC)
    bbb = Gpu.objects.get(uuid="GPU-bbb")
    assert (bbb.util_pct, bbb.sampled_at) == (50.0, datetime.fromtimestamp(now, tz=UTC))


def test_malformed_samples_are_rejected_and_logged_while_the_good_ones_are_stored(
    registered_node: Any, caplog: pytest.LogCaptureFixture
) -> None:
    now = time.time()
    batch = [
        a_sample("GPU-aaa", now),
        "not a sample",
        a_sample("GPU-aaa", now - 1, util_pct=250.0),
        a_sample("GPU-bbb", now, mem_used_mb=-5),
        a_sample("GPU-bbb", float("nan")),
        a_sample("GPU-bbb", now + 3600),
        a_sample("GPU-bbb", now - 2, processes=[{"pid": "1"}]),
        a_sample("GPU-bbb", now - 3, temp_c=True),
        {"ts": now},
        a_sample("GPU-bbb", now - 4),
    ]

    with caplog.at_level(logging.WARNING, logger="cluster.services"):
        assert samples_ingest("gpu01", registered_node[1], batch) == "ok"

    assert sorted(GpuSample.objects.values_list("gpu__uuid", flat=True)) == ["GPU-aaa", "GPU-bbb"]
    refused = [r for r in caplog.records if "refused samples_ingest" in r.getMessage()]
    assert len(refused) == 8
    assert any("util_pct" in r.getMessage() for r in refused)
    assert any("clock" in r.getMessage() for r in refused)
    assert RejectedMessage.objects.get(reason="malformed").count == 8


def test_a_sample_about_another_nodes_gpu_is_refused(registered_node: Any, other_node: Any) -> None:
    batch = [a_sample("GPU-other-0", util_pct=0.0), a_sample("GPU-aaa")]

    samples_ingest("gpu01", registered_node[1], batch)

    assert list(GpuSample.objects.values_list("gpu__uuid", flat=True)) == ["GPU-aaa"]
    assert Gpu.objects.get(uuid="GPU-other-0").sampled_at is None
    assert RejectedMessage.objects.get().reason == "gpu_not_on_node"


def test_a_sample_naming_a_job_of_another_node_is_refused(
    registered_node: Any, other_node: Any, alice: Any, bob: Any
) -> None:
    alices_job = job_on(registered_node[0], alice)
    bobs_job = job_on(other_node, bob)
    now = time.time()
    batch = [
        a_sample(
            "GPU-aaa",
            now,
            processes=[{"pid": 10, "used_mb": 100, "container_id": "c1", "job_id": alices_job.pk}],
        ),
        a_sample(
            "GPU-bbb",
            now,
            processes=[{"pid": 11, "used_mb": 100, "container_id": "c2", "job_id": bobs_job.pk}],
        ),
    ]

    samples_ingest("gpu01", registered_node[1], batch)

    stored = GpuSample.objects.get()
    assert (stored.gpu.uuid, stored.job_id) == ("GPU-aaa", alices_job.pk)
    assert stored.processes == [
        {"pid": 10, "used_mb": 100, "container_id": "c1", "job_id": alices_job.pk}
    ]
    assert RejectedMessage.objects.get().reason == "job_not_on_node"


def test_samples_with_a_wrong_token_store_nothing(registered_node: Any) -> None:
    assert samples_ingest("gpu01", "lpn_wrong", [a_sample("GPU-aaa")]) == "refused: bad_token"
    assert not GpuSample.objects.exists()


def test_a_batch_that_is_not_a_list_is_refused(registered_node: Any) -> None:
    assert (
        samples_ingest("gpu01", registered_node[1], {"gpu_uuid": "GPU-aaa"}) == "refused: malformed"
    )


def test_a_process_not_traced_to_a_job_is_kept_for_the_alerts(registered_node: Any) -> None:
    processes = [{"pid": 4242, "used_mb": 2048, "container_id": None, "job_id": None}]

    samples_ingest("gpu01", registered_node[1], [a_sample("GPU-aaa", processes=processes)])

    stored = GpuSample.objects.get()
    assert (stored.processes, stored.job_id) == (processes, None)


def test_a_sample_is_stored_exactly_whatever_characters_and_number_types_it_holds(
    registered_node: Any,
) -> None:
    odd_user = 'o"dd\\ us,er{x} NULL 用户'
    processes = [
        {"pid": 7, "used_mb": None, "container_id": "c0ffee", "job_id": None, "unix_user": odd_user}
    ]
    now = time.time()
    batch = [
        a_sample("GPU-aaa", now, util_pct=50, power_w=1e-05, processes=processes),
        a_sample("GPU-bbb", now - 0.000001, util_pct=12.5, ecc_errors=2**62),
    ]

    assert samples_ingest("gpu01", registered_node[1], batch) == "ok"

    aaa = GpuSample.objects.get(gpu__uuid="GPU-aaa")
    assert aaa.processes == processes
    assert (aaa.util_pct, aaa.power_w) == (50.0, 1e-05)
    assert aaa.ts == datetime.fromtimestamp(now, tz=UTC)
    bbb = GpuSample.objects.get(gpu__uuid="GPU-bbb")
    assert (bbb.ecc_errors, bbb.processes) == (2**62, [])
    assert bbb.ts == datetime.fromtimestamp(now - 0.000001, tz=UTC)
    assert Gpu.objects.get(uuid="GPU-aaa").power_w == 1e-05

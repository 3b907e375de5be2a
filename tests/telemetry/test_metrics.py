"""/metrics: the scrape token, the names, labels and types, a fixed query count, and promtool."""

from __future__ import annotations

import shutil
import subprocess
import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
import time_machine
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from accounts.models import CreditAccount, LedgerEntry
from cluster.models import Gpu, Node
from cluster.tasks import broker_message_dropped, node_heartbeat, node_register
from core.metrics import metrics_registry
from jobqueue.models import Allocation, Job
from protocol.broker import UNDECODABLE, Rejection
from scheduling.tasks import scheduling_pass_task
from telemetry.models import ScrapeToken
from telemetry.tasks import samples_ingest
from tests.cluster.conftest import gpu_entry, job_on, register_info
from tests.conftest import require_in_ci
from tests.factories import GpuFactory, NodeFactory
from tests.telemetry.test_ingest import a_sample

pytestmark = pytest.mark.django_db


@pytest.fixture
def scrape_token(db: Any) -> str:
    _token, secret = ScrapeToken.issue(name="prometheus")
    return secret


def scrape(token: str | None) -> Any:
    if token is None:
        return Client().get("/metrics")
    return Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")


def families(token: str) -> dict[str, Any]:
    response = scrape(token)
    assert response.status_code == 200, response.content
    return {f.name: f for f in text_string_to_metric_families(response.content.decode())}


def by_labels(family: Any, suffix: str = "", **labels: str) -> float:
    matches = [
        s.value
        for s in family.samples
        if s.name == family.name + suffix and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(matches) == 1, (family.name, labels, family.samples)
    return float(matches[0])


def test_it_refuses_a_scrape_without_a_valid_token(scrape_token: str) -> None:
    missing = scrape(None)
    assert missing.status_code == 401
    assert b"Authorization: Bearer" in missing.content
    assert missing["WWW-Authenticate"].startswith("Bearer")
    assert scrape("lpm_not-a-token").status_code == 401
    ScrapeToken.objects.update(revoked_at=timezone.now())
    assert scrape(scrape_token).status_code == 401


GPU_SERIES_LABELS = {"node", "gpu", "model"}


def test_a_gpu_carries_its_readings_and_the_job_holding_it_is_an_info_series(
    registered_node: Any, scrape_token: str, alice: Any
) -> None:
    node, secret = registered_node
    job = job_on(node, alice)
    aaa = Gpu.objects.get(uuid="GPU-aaa")
    Allocation.objects.create(job=job, gpu=aaa)
    samples_ingest(
        "gpu01",
        secret,
        [
            a_sample("GPU-aaa", util_pct=87.0, mem_used_mb=1024, ecc_errors=3, xid_errors=1),
            a_sample("GPU-bbb", util_pct=5.0),
        ],
    )

    found = families(scrape_token)

    held = {"node": "gpu01", "gpu": "0", "model": aaa.model}
    assert found["labportal_gpu_utilization_ratio"].type == "gauge"
    assert by_labels(found["labportal_gpu_utilization_ratio"], **held) == pytest.approx(0.87)
    assert by_labels(found["labportal_gpu_memory_used_bytes"], **held) == 1024 * 1024 * 1024
    assert by_labels(found["labportal_gpu_memory_total_bytes"], **held) == aaa.memory_mb * 2**20
    assert by_labels(found["labportal_gpu_temperature_celsius"], **held) == 66.0
    assert by_labels(found["labportal_gpu_power_watts"], **held) == 512.5
    assert by_labels(found["labportal_gpu_allocated"], **held) == 1
    assert found["labportal_gpu_ecc_errors"].type == "counter"
    assert by_labels(found["labportal_gpu_ecc_errors"], "_total", **held) == 3
    assert by_labels(found["labportal_gpu_xid_errors"], "_total", **held) == 1
    assert by_labels(found["labportal_gpu_allocated"], gpu="1") == 0
    assert by_labels(found["labportal_gpu_utilization_ratio"], gpu="1") == pytest.approx(0.05)
    # Per-job detail stays out of the GPU's own series: they live as long as the GPU.
    gpu_families = [f for name, f in found.items() if name.startswith("labportal_gpu_")]
    for family in gpu_families:
        if family.name in ("labportal_gpu_info", "labportal_gpu_job_info"):
            continue
        assert family.samples, family.name
        assert {k for s in family.samples for k in s.labels} == GPU_SERIES_LABELS, family.name
    # The holder is its own series, for the GPU a job holds now and for no other.
    holders = found["labportal_gpu_job_info"]
    assert holders.type == "gauge"
    assert [(s.labels, s.value) for s in holders.samples] == [
        ({"node": "gpu01", "gpu": "0", "job_id": str(job.pk), "user": "alice"}, 1.0)
    ]
    assert by_labels(found["labportal_gpu_info"], gpu="0", uuid="GPU-aaa", kind="gpu") == 1


def test_the_job_info_names_the_current_job_only_and_goes_when_it_ends(
    registered_node: Any, scrape_token: str, alice: Any, bob: Any
) -> None:
    node, _secret = registered_node
    aaa = Gpu.objects.get(uuid="GPU-aaa")
    first = job_on(node, alice)
    Allocation.objects.create(job=first, gpu=aaa)
    assert {
        s.labels["job_id"] for s in families(scrape_token)["labportal_gpu_job_info"].samples
    } == {str(first.pk)}

    Allocation.objects.filter(job=first).update(active=False)
    Job.objects.filter(pk=first.pk).update(state=Job.State.COMPLETED, ended_at=timezone.now())
    ended = families(scrape_token)
    assert ended["labportal_gpu_job_info"].samples == []
    assert by_labels(ended["labportal_gpu_allocated"], gpu="0") == 0

    second = job_on(node, bob)
    Allocation.objects.create(job=second, gpu=aaa)
    now_held = families(scrape_token)["labportal_gpu_job_info"].samples
    assert [s.labels for s in now_held] == [
        {"node": "gpu01", "gpu": "0", "job_id": str(second.pk), "user": "bob"}
    ]


def test_the_series_do_not_grow_with_the_jobs_a_lab_has_run(
    registered_node: Any,
    scrape_token: str,
    alice: Any,
    queues: Any,  # the queues' series from the start, even after a transactional test
) -> None:
    node, secret = registered_node
    gpus = list(Gpu.objects.order_by("index"))

    def series() -> set[tuple[str, tuple[tuple[str, str], ...]]]:
        samples_ingest("gpu01", secret, [a_sample(g.uuid, time.time()) for g in gpus])
        found = families(scrape_token)
        return {
            (s.name, tuple(sorted(s.labels.items()))) for f in found.values() for s in f.samples
        }

    idle = series()
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for _round in range(5):
        jobs = [job_on(node, alice) for _gpu in gpus]
        for job, gpu in zip(jobs, gpus, strict=True):
            Allocation.objects.create(job=job, gpu=gpu)
        seen |= series()
        Allocation.objects.filter(active=True).update(active=False)
        Job.objects.filter(pk__in=[j.pk for j in jobs]).update(state=Job.State.COMPLETED)
        seen |= series()

    def long_lived(found: set[tuple[str, tuple[tuple[str, str], ...]]]) -> set[Any]:
        return {s for s in found if s[0] != "labportal_gpu_job_info" and "_age_" not in s[0]}

    # Ten jobs later, the same long-lived series as before any, and one short-lived
    # holder series per job and GPU (each only while its job ran).
    assert long_lived(seen) == long_lived(idle)
    assert len([s for s in seen if s[0] == "labportal_gpu_job_info"]) == 10
    assert {s for s in series() if s[0] == "labportal_gpu_job_info"} == set()


def test_a_gpu_that_replaced_a_missing_one_keeps_its_place_and_labels_stay_unique(
    registered_node: Any, scrape_token: str, issue_token: Any
) -> None:
    node, secret = registered_node
    # GPU-aaa is swapped for GPU-ccc in slot 0: the old row stays, missing.
    node_register("gpu01", secret, register_info(gpu_entry("GPU-ccc", 0), gpu_entry("GPU-bbb", 1)))
    assert Gpu.objects.get(uuid="GPU-aaa").state == Gpu.State.MISSING

    found = families(scrape_token)

    info = found["labportal_gpu_info"]
    assert by_labels(info, node="gpu01", gpu="0") == 1
    assert by_labels(info, uuid="GPU-ccc", gpu="0") == 1
    assert by_labels(info, uuid="GPU-aaa", gpu="0/GPU-aaa") == 1
    for family in found.values():
        identities = [(s.name, tuple(sorted(s.labels.items()))) for s in family.samples]
        assert len(identities) == len(set(identities)), family.name


def test_the_scrape_is_prometheus_clients_own_exposition(
    registered_node: Any, scrape_token: str, alice: Any
) -> None:
    node, secret = registered_node
    Gpu.objects.filter(uuid="GPU-bbb").update(model='Odd "model" \\ with\na newline')
    Allocation.objects.create(job=job_on(node, alice), gpu=Gpu.objects.get(uuid="GPU-aaa"))
    samples_ingest("gpu01", secret, [a_sample("GPU-aaa", ecc_errors=2), a_sample("GPU-bbb")])
    scheduling_pass_task()

    with time_machine.travel(timezone.now(), tick=False):
        served = scrape(scrape_token)
        written = generate_latest(metrics_registry())

    assert served["Content-Type"] == CONTENT_TYPE_LATEST
    assert served.content == written
    assert b"labportal_scheduling_pass_duration_seconds_bucket{" in served.content
    parsed = {f.name: f for f in text_string_to_metric_families(served.content.decode())}
    assert by_labels(parsed["labportal_gpu_info"], uuid="GPU-bbb", gpu="1") == 1
    odd = [s for s in parsed["labportal_gpu_info"].samples if s.labels["uuid"] == "GPU-bbb"]
    assert odd[0].labels["model"] == 'Odd "model" \\ with\na newline'


def test_a_silent_gpu_keeps_its_info_but_no_stale_reading(
    registered_node: Any, scrape_token: str
) -> None:
    _node, secret = registered_node
    samples_ingest("gpu01", secret, [a_sample("GPU-aaa", time.time() - 3600)])

    found = families(scrape_token)

    assert by_labels(found["labportal_gpu_info"], uuid="GPU-aaa", kind="gpu") == 1
    assert not [s for s in found["labportal_gpu_utilization_ratio"].samples]
    assert by_labels(found["labportal_gpu_sample_age_seconds"], gpu="0") >= 3600


def test_nodes_queues_waits_reservations_and_credits(
    registered_node: Any, scrape_token: str, alice: Any, bob: Any, charlie: Any
) -> None:
    node, _secret = registered_node
    Node.objects.filter(pk=node.pk).update(
        drain_requested=True, state=Node.State.DRAINING, last_heartbeat=timezone.now()
    )
    NodeFactory.create(name="gpu09", state=Node.State.DOWN)
    for user, gpus in ((alice, 2), (bob, 1)):
        waiting = job_on(None, user, state="pending")
        Job.objects.filter(pk=waiting.pk).update(gpus=gpus)
    started = job_on(node, charlie, state="running")
    Job.objects.filter(pk=started.pk).update(
        submitted_at=timezone.now() - timedelta(seconds=400),
        started_at=timezone.now(),
    )
    for user, kind, amount in (
        (alice, LedgerEntry.Kind.GRANT, "100"),
        (alice, LedgerEntry.Kind.CHARGE, "-30"),
        (bob, LedgerEntry.Kind.GRANT, "100"),
        (charlie, LedgerEntry.Kind.GRANT, "50"),
    ):
        account, _ = CreditAccount.objects.get_or_create(user=user)
        LedgerEntry.objects.create(
            account=account,
            kind=kind,
            amount=Decimal(amount),
            balance_after=Decimal(0),
            idempotency_key=f"{user.username}-{kind}",
        )

    found = families(scrape_token)

    assert by_labels(found["labportal_node_up"], node="gpu01") == 1
    assert by_labels(found["labportal_node_draining"], node="gpu01") == 1
    assert by_labels(found["labportal_node_up"], node="gpu09") == 0
    assert by_labels(found["labportal_node_heartbeat_age_seconds"], node="gpu01") < 60
    assert by_labels(found["labportal_queue_pending_jobs"], queue="normal") == 2
    assert by_labels(found["labportal_queue_pending_gpus"], queue="normal") == 3
    assert by_labels(found["labportal_queue_running_jobs"], queue="normal") == 1
    wait = found["labportal_job_wait_seconds"]
    assert wait.type == "histogram"
    assert by_labels(wait, "_bucket", le="300.0") == 0
    assert by_labels(wait, "_bucket", le="900.0") == 1
    assert by_labels(wait, "_count") == 1
    assert by_labels(found["labportal_reservations_active"]) == 0
    granted, spent = found["labportal_credits_granted"], found["labportal_credits_spent"]
    assert by_labels(granted, "_total", category="PhD, thesis phase") == 200
    assert by_labels(spent, "_total", category="PhD, thesis phase") == 30
    assert by_labels(granted, "_total", category="Master") == 50
    # Balances stay private: no metric is labelled with a member.
    credit_labels = {k for f in (granted, spent) for s in f.samples for k in s.labels}
    assert credit_labels == {"category"}


def test_scheduling_passes_are_counted_in_a_histogram(
    registered_node: Any, scrape_token: str
) -> None:
    scheduling_pass_task()
    scheduling_pass_task()

    passes = families(scrape_token)["labportal_scheduling_pass_duration_seconds"]

    assert passes.type == "histogram"
    assert by_labels(passes, "_count") == 2
    assert by_labels(passes, "_bucket", le="+Inf") == 2
    assert by_labels(passes, "_sum") > 0


def test_refused_and_dropped_agent_messages_are_counted_by_reason(
    registered_node: Any, scrape_token: str
) -> None:
    for text in ("", "not json"):
        broker_message_dropped(Rejection(UNDECODABLE, "control", f"not JSON: {text!r}"))
    node_heartbeat("gpu01", None, {})

    rejected = families(scrape_token)["labportal_agent_messages_rejected"]

    assert rejected.type == "counter"
    assert by_labels(rejected, "_total", reason="malformed") == 2
    assert by_labels(rejected, "_total", reason="bad_token") == 1
    # Node and task names come from the senders: they stay out of the labels.
    assert {k for s in rejected.samples for k in s.labels} == {"reason"}


def test_a_scrape_costs_the_same_queries_for_two_gpus_or_forty(
    registered_node: Any, scrape_token: str, alice: Any
) -> None:
    node, secret = registered_node
    samples_ingest("gpu01", secret, [a_sample("GPU-aaa"), a_sample("GPU-bbb")])
    scrape(scrape_token)  # the first use of a token is recorded once
    with CaptureQueriesContext(connection) as small:
        scrape(scrape_token)
    for index in range(2, 40):
        gpu = GpuFactory.create(node=node, index=index, uuid=f"GPU-more-{index}")
        Allocation.objects.create(job=job_on(node, alice), gpu=gpu)
    with CaptureQueriesContext(connection) as large:
        scrape(scrape_token)

    assert len(large.captured_queries) == len(small.captured_queries)


def test_promtool_accepts_the_exposition(
    registered_node: Any, scrape_token: str, alice: Any
) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        require_in_ci("promtool (Debian package prometheus)")
    node, secret = registered_node
    Allocation.objects.create(job=job_on(node, alice), gpu=Gpu.objects.get(uuid="GPU-aaa"))
    samples_ingest("gpu01", secret, [a_sample("GPU-aaa"), a_sample("GPU-bbb")])
    scheduling_pass_task()
    body = scrape(scrape_token).content

    checked = subprocess.run(
        [str(promtool), "check", "metrics"], input=body, capture_output=True, timeout=60
    )

    assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()
    assert (checked.stdout + checked.stderr).strip() == b""

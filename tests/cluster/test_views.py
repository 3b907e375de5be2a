from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from cluster.models import Gpu, Node
from tests.cluster.conftest import job_on
from tests.factories import GpuFactory, NodeFactory

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.cluster.urls")]


@pytest.fixture
def busy_lab(alice: Any) -> dict[str, Any]:
    """gpu01 (real, with alice's job on GPU 0) and sim-node-1 (simulated, idle)."""
    from jobqueue.models import Allocation

    node = NodeFactory.create(
        name="gpu01",
        gpu_backend="nvml",
        runtime="docker",
        last_heartbeat=timezone.now() - timedelta(seconds=4),
    )
    gpu = GpuFactory.create(
        node=node,
        index=0,
        uuid="GPU-aaa",
        model="NVIDIA H100 80GB HBM3",
        util_pct=93.0,
        mem_used_mb=40000,
        memory_mb=81559,
        temp_c=71.0,
        sampled_at=timezone.now() - timedelta(seconds=3),
    )
    GpuFactory(node=node, index=1, uuid="GPU-bbb")
    job = job_on(node, alice, name="resnet-sweep")
    Allocation.objects.create(job=job, gpu=gpu)
    sim = NodeFactory(name="sim-node-1", gpu_backend="simulated", runtime="local")
    GpuFactory(node=sim, index=0, uuid="GPU-sim-sim-node-1-0", model="Simulated A100 80GB")
    return {"node": node, "gpu": gpu, "job": job, "sim": sim}


def test_the_live_page_shows_who_uses_each_gpu_with_which_job(
    client: Client, bob: Any, busy_lab: Any
) -> None:
    client.force_login(bob)
    # Ages are shown in whole seconds: freeze the clock, or a slow machine shows "4 s ago".
    with time_machine.travel(busy_lab["gpu"].sampled_at + timedelta(seconds=3), tick=False):
        html = client.get(reverse("gpu_live")).content.decode()

    job = busy_lab["job"]
    assert "alice" in html
    assert f'href="/jobs/{job.pk}/"' in html
    assert "resnet-sweep" in html
    assert "93%" in html and "40000 / 81559 MiB" in html and "71 °C" in html
    assert "3 s ago" in html  # the sample's age
    assert "4 s ago" in html  # the heartbeat's age


def test_the_live_page_marks_simulated_nodes(client: Client, bob: Any, busy_lab: Any) -> None:
    client.force_login(bob)

    html = client.get(reverse("gpu_table")).content.decode()

    sim_section = html.split('data-node="sim-node-1"')[1]
    real_section = html.split('data-node="gpu01"')[1].split('data-node="sim-node-1"')[0]
    assert 'class="badge sim"' in sim_section
    assert 'class="badge sim"' not in real_section


def test_a_released_allocation_no_longer_shows_its_user(
    client: Client, bob: Any, busy_lab: Any
) -> None:
    from jobqueue.models import Allocation

    Allocation.objects.update(active=False)
    client.force_login(bob)

    assert "resnet-sweep" not in client.get(reverse("gpu_table")).content.decode()


def test_the_users_of_shared_slots_show_on_their_gpu(
    client: Client, bob: Any, charlie: Any
) -> None:
    from jobqueue.models import Allocation

    node = NodeFactory.create(name="gpu03")
    parent = GpuFactory(node=node, index=0, uuid="GPU-shared", shared_slots=2)
    slots = [
        GpuFactory.create(
            node=node, index=0, uuid=f"GPU-shared-slot-{i}", kind=Gpu.Kind.SLOT, parent=parent
        )
        for i in range(2)
    ]
    Allocation.objects.create(job=job_on(node, charlie, name="debug-notebook"), gpu=slots[1])
    client.force_login(bob)

    html = client.get(reverse("gpu_table")).content.decode()

    assert "debug-notebook" in html and "charlie" in html
    assert "1 of 2 shared slots in use" in html
    assert "GPU-shared-slot-0" not in html  # slots are shown on their GPU's row


def test_the_live_table_needs_a_login(client: Client) -> None:
    assert client.get(reverse("gpu_table")).status_code == 302


def test_staff_drain_a_node_from_the_page(client: Client, admin_user: Any, busy_lab: Any) -> None:
    client.force_login(admin_user)
    node = busy_lab["node"]

    response = client.post(reverse("node_drain", args=[node.name]), {"drain": "1"})

    assert response.status_code == 302
    node.refresh_from_db()
    assert (node.drain_requested, node.state) == (True, Node.State.DRAINING)
    html = client.get(reverse("gpu_live")).content.decode()
    assert "is draining" in html
    assert 'data-testid="undrain"' in html


def test_staff_return_a_drained_node_to_service_with_htmx(
    client: Client, admin_user: Any, busy_lab: Any
) -> None:
    node = busy_lab["node"]
    node.drain_requested, node.state = True, Node.State.DRAINING
    node.save()
    client.force_login(admin_user)

    response = client.post(
        reverse("node_drain", args=[node.name]), {"drain": "0"}, HTTP_HX_REQUEST="true"
    )

    assert response.status_code == 200
    assert 'data-node="gpu01"' in response.content.decode()  # the refreshed table
    node.refresh_from_db()
    assert (node.drain_requested, node.state) == (False, Node.State.UP)


def test_members_cannot_drain_a_node(
    client: Client, alice: Any, charlie: Any, busy_lab: Any
) -> None:
    node = busy_lab["node"]
    for member in (alice, charlie):
        client.force_login(member)
        assert (
            client.post(reverse("node_drain", args=[node.name]), {"drain": "1"}).status_code == 403
        )
    node.refresh_from_db()
    assert (node.drain_requested, node.state) == (False, Node.State.UP)


def test_members_see_no_drain_buttons(client: Client, alice: Any, busy_lab: Any) -> None:
    client.force_login(alice)

    html = client.get(reverse("gpu_live")).content.decode()

    assert 'data-testid="drain"' not in html


def test_drain_needs_a_post_and_a_clear_choice(
    client: Client, admin_user: Any, busy_lab: Any
) -> None:
    client.force_login(admin_user)
    url = reverse("node_drain", args=["gpu01"])

    assert client.get(url).status_code == 405
    assert client.post(url, {"drain": "maybe"}).status_code == 400
    assert client.post(reverse("node_drain", args=["nope"]), {"drain": "1"}).status_code == 404


def test_the_gpus_page_still_renders_without_the_cluster_urls_included(
    client: Client, admin_user: Any, busy_lab: Any, settings: Any
) -> None:
    settings.ROOT_URLCONF = "labportal.urls"
    client.force_login(admin_user)

    response = client.get("/gpus/")

    assert response.status_code == 200
    assert "resnet-sweep" in response.content.decode()


def test_the_live_table_costs_the_same_queries_for_many_gpus_and_users(
    client: Client, bob: Any, charlie: Any, busy_lab: Any
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobqueue.models import Allocation

    client.force_login(bob)
    with CaptureQueriesContext(connection) as few:
        client.get(reverse("gpu_table"))
    node = NodeFactory.create(name="gpu09")
    for index in range(6):
        gpu = GpuFactory.create(node=node, index=index)
        Allocation.objects.create(job=job_on(node, charlie, name=f"job-{index}"), gpu=gpu)
    with CaptureQueriesContext(connection) as many:
        html = client.get(reverse("gpu_table")).content.decode()

    assert "job-5" in html
    assert len(many.captured_queries) == len(few.captured_queries)


def test_staff_get_grafana_deep_links_per_node_and_gpu(
    client: Client, admin_user: Any, bob: Any, busy_lab: Any, settings: Any
) -> None:
    settings.LABPORTAL_GRAFANA_URL = "https://grafana.lab.example.org"
    client.force_login(admin_user)
    html = client.get(reverse("gpu_live")).content.decode()
    assert 'href="https://grafana.lab.example.org/d/labportal-node/?var-node=gpu01"' in html
    assert (
        'href="https://grafana.lab.example.org/d/labportal-gpu/?var-node=gpu01&amp;var-uuid=GPU-aaa"'
        in html
    )
    client.force_login(bob)
    assert "grafana.lab.example.org" not in client.get(reverse("gpu_live")).content.decode()


def test_without_a_grafana_address_there_are_no_grafana_links(
    client: Client, admin_user: Any, busy_lab: Any
) -> None:
    client.force_login(admin_user)
    html = client.get(reverse("gpu_live")).content.decode()
    assert 'data-testid="grafana-node"' not in html and 'data-testid="grafana-gpu"' not in html


def test_the_staff_menu_links_grafana_where_it_is_set(admin_user: Any, settings: Any) -> None:
    from django.test import override_settings

    settings.LABPORTAL_GRAFANA_URL = "https://grafana.lab.example.org"
    client = Client()
    client.force_login(admin_user)
    with override_settings(ROOT_URLCONF="labportal.urls"):
        html = client.get("/").content.decode()
    assert 'data-testid="nav-grafana"' in html
    assert 'href="https://grafana.lab.example.org/d/labportal-overview/"' in html


@pytest.mark.parametrize(
    ("language", "in_use", "free"), [("en", "in use", "available"), ("zh-hans", "使用中", "可用")]
)
def test_a_gpu_running_a_job_reads_in_use_not_available(
    client: Client, bob: Any, busy_lab: Any, language: str, in_use: str, free: str
) -> None:
    client.force_login(bob)
    html = client.get(reverse("gpu_live"), HTTP_ACCEPT_LANGUAGE=language).content.decode()
    busy = html.split('data-gpu="GPU-aaa"')[1].split("</tr>")[0]
    idle = html.split('data-gpu="GPU-bbb"')[1].split("</tr>")[0]
    assert f'<span data-testid="gpu-in-use">{in_use}</span>' in busy
    assert free in idle and in_use not in idle


@pytest.mark.parametrize(
    ("language", "sim_line", "real_line"),
    [
        ("en", "simulated GPUs / local processes", "NVIDIA GPUs (NVML) / Docker containers"),
        ("zh-hans", "模拟 GPU / 本地进程", "NVIDIA GPU（NVML） / Docker 容器"),
    ],
)
def test_the_agent_line_names_the_gpu_backend_and_runtime_in_the_readers_language(
    client: Client, bob: Any, busy_lab: Any, language: str, sim_line: str, real_line: str
) -> None:
    Node.objects.filter(name="sim-node-1").update(agent_version="0.1.0")
    client.force_login(bob)
    html = client.get(reverse("gpu_table"), HTTP_ACCEPT_LANGUAGE=language).content.decode()
    sim = html.split('data-node="sim-node-1"')[1]
    real = html.split('data-node="gpu01"')[1].split('data-node="sim-node-1"')[0]
    assert f'<span data-testid="node-backend">{sim_line}</span>' in sim
    assert f'<span data-testid="node-backend">{real_line}</span>' in real
    if language != "en":
        assert "代理 0.1.0" in sim
        assert "simulated/local" not in sim and "nvml/docker" not in real


def test_the_node_labels_cover_every_backend_and_runtime_an_agent_may_report() -> None:
    from protocol.messages import GPU_BACKENDS, RUNTIMES

    assert set(Node.GpuBackend.values) == set(GPU_BACKENDS)
    assert set(Node.Runtime.values) == set(RUNTIMES)

"""The submit page says where a job runs: in a container, or on the node as it is."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests.factories import make_slot

pytestmark = pytest.mark.django_db


def test_the_submit_page_promises_a_container_only_where_jobs_get_one(
    client: Client, alice: Any, queues: Any, settings: Any
) -> None:
    client.force_login(alice)
    agents = client.get("/jobs/submit/").content.decode()
    assert "Your job runs in a container" in agents

    settings.LABPORTAL_EXECUTOR = "slurm"
    settings.LABPORTAL_SLURM_CONTAINER = "none"
    bare = client.get("/jobs/submit/").content.decode()
    assert "in a container" not in bare
    assert "this lab's Slurm runs no containers" in bare

    settings.LABPORTAL_SLURM_CONTAINER = "pyxis"
    assert "Your job runs in a container" in client.get("/jobs/submit/").content.decode()


def test_the_shared_slot_box_is_offered_only_where_a_node_has_slots(
    client: Client, alice: Any, cluster: Any
) -> None:
    client.force_login(alice)
    assert 'name="shared_slot"' not in client.get("/jobs/submit/").content.decode()
    make_slot()
    assert 'name="shared_slot"' in client.get("/jobs/submit/").content.decode()


def test_slurm_mode_refuses_a_shared_slot_and_says_what_to_ask_for(
    alice: Any, cluster: Any, image: Any, settings: Any
) -> None:
    from jobqueue.errors import JobRefused
    from jobqueue.models import Job
    from jobqueue.submit import job_submit

    make_slot()
    settings.LABPORTAL_EXECUTOR = "slurm"
    with pytest.raises(JobRefused, match="whole GPUs here.*ask for 1 GPU without a shared slot"):
        job_submit(
            owner=alice,
            queue="debug",
            image=image.reference,
            command="true",
            shared_slot=True,
            time_limit_s=600,
        )
    assert not Job.objects.exists()


def test_slurm_mode_offers_no_preemptible_box_it_could_not_honour(
    client: Client, alice: Any, cluster: Any, settings: Any
) -> None:
    client.force_login(alice)
    assert 'name="preemptible"' in client.get("/jobs/submit/").content.decode()
    settings.LABPORTAL_EXECUTOR = "slurm"
    assert 'name="preemptible"' not in client.get("/jobs/submit/").content.decode()

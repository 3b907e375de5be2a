"""The guided first job: each of the tutorial's five steps is ticked only after the member
did it (their own job submitted, its page opened, a finished job's log read, a booking
made, My credits opened), and the Hello GPU template it starts from."""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from handbook.hello_gpu import TEMPLATE_NAME, hello_gpu_command, hello_gpu_template
from handbook.selectors import tutorial_steps
from jobqueue.models import ContainerImage, Job, JobTemplate
from jobqueue.submit import job_submit
from reservations.services import reservation_create
from tests.factories import make_cluster

pytestmark = pytest.mark.django_db


def done(user: Any) -> list[str]:
    return [step.key for step in tutorial_steps(user) if step.done]


def page_done(client: Client) -> dict[str, bool]:
    body = client.get(reverse("tutorial")).content.decode()
    return {key: f'data-step="{key}" data-done="true"' in body for key in _KEYS}


_KEYS = ("submit", "watch", "logs", "booking", "credits")


def test_each_step_is_ticked_only_after_the_member_did_it(
    alice: Any, charlie: Any, queues: Any, image: Any
) -> None:
    (node,) = make_cluster(nodes=1, gpus_per_node=2)
    client = Client()
    client.force_login(alice)
    assert page_done(client) == dict.fromkeys(_KEYS, False)

    # Someone else's job, and its page opened by staff-less alice: not her steps.
    other = job_submit(owner=charlie, queue="debug", image=image.reference, command="true")
    assert client.get(reverse("job_detail", args=[other.pk])).status_code in (403, 404)
    assert done(alice) == []

    job = job_submit(owner=alice, queue="debug", image=image.reference, command="true")
    assert done(alice) == ["submit"]
    assert client.get(reverse("job_detail", args=[job.pk])).status_code == 200
    # The page of a job still waiting is watching it; its log is not read until it ended.
    assert done(alice) == ["submit", "watch"]

    Job.objects.filter(pk=job.pk).update(state=Job.State.COMPLETED, ended_at=timezone.now())
    assert client.get(f"/api/jobs/{job.pk}/log/").status_code == 200
    assert done(alice) == ["submit", "watch", "logs"]

    start = (timezone.now() + timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
    reservation_create(
        user=alice, node=node, gpu_count=1, start=start, end=start + timedelta(hours=1)
    )
    assert done(alice) == ["submit", "watch", "logs", "booking"]

    assert client.get(reverse("credits")).status_code == 200
    assert page_done(client) == dict.fromkeys(_KEYS, True)
    assert "tutorial-complete" in client.get(reverse("tutorial")).content.decode()
    assert done(charlie) == ["submit"]


def test_the_log_step_waits_for_a_finished_job_across_sessions(
    alice: Any, queues: Any, image: Any
) -> None:
    make_cluster(nodes=1, gpus_per_node=1)
    client = Client()
    client.force_login(alice)
    job = job_submit(owner=alice, queue="debug", image=image.reference, command="true")
    client.get(reverse("job_detail", args=[job.pk]))
    client.get(f"/api/jobs/{job.pk}/log/")
    assert "logs" not in done(alice)
    Job.objects.filter(pk=job.pk).update(state=Job.State.FAILED, ended_at=timezone.now())
    client.get(reverse("job_detail", args=[job.pk]))
    assert "logs" in done(alice)


def test_history_from_before_joining_ticks_no_step(alice: Any, queues: Any, image: Any) -> None:
    make_cluster(nodes=1, gpus_per_node=1)
    job = job_submit(owner=alice, queue="debug", image=image.reference, command="true")
    Job.objects.filter(pk=job.pk).update(submitted_at=alice.date_joined - timedelta(days=30))
    assert done(alice) == []


def test_the_steps_link_to_where_each_is_done(alice: Any, queues: Any, image: Any) -> None:
    call_command("seed_hello_gpu", image=image.reference, stdout=io.StringIO())
    template = hello_gpu_template()
    assert template is not None
    links = {step.key: step.url for step in tutorial_steps(alice)}
    assert links["submit"] == f"{reverse('job_submit')}?template={template.pk}"
    assert links["booking"] == reverse("reservation_calendar")
    assert links["credits"] == reverse("credits")
    client = Client()
    client.force_login(alice)
    # The template fills the submit form in with the Hello GPU script.
    form = client.get(links["submit"]).content.decode()
    assert "GPUs given to this job" in form
    # The home page's first steps and the manual lead to the tutorial.
    assert reverse("tutorial") in client.get(reverse("dashboard")).content.decode()
    manual = client.get(reverse("help_page", args=["getting-started"])).content.decode()
    assert reverse("tutorial") in manual


def test_the_hello_gpu_template_is_lab_wide_and_refreshed_not_duplicated(
    queues: Any, image: Any
) -> None:
    call_command("seed_hello_gpu", image="lab/hello-gpu", stdout=io.StringIO())
    call_command("seed_hello_gpu", image="lab/hello-gpu", stdout=io.StringIO())
    template = JobTemplate.objects.get(name=TEMPLATE_NAME)
    assert template.owner is None
    assert template.fields["queue"] == "debug" and template.fields["gpus"] == 1
    assert template.fields["command"] == hello_gpu_command()
    assert ContainerImage.objects.filter(reference="lab/hello-gpu").exists()
    with pytest.raises(CommandError, match="no open queue 'training'.*debug"):
        call_command("seed_hello_gpu", queue="training")


def test_the_hello_gpu_script_runs_with_plain_python3_and_prints_its_gpu(tmp_path: Any) -> None:
    import subprocess

    script = tmp_path / "job.sh"
    script.write_text(hello_gpu_command())
    env = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "1", "HELLO_GPU_SECONDS": "0.2"}
    done_run = subprocess.run(
        ["/bin/sh", str(script)], capture_output=True, text=True, env=env, timeout=60
    )
    assert done_run.returncode == 0, done_run.stderr
    assert "GPUs given to this job: CUDA_VISIBLE_DEVICES=1\n" in done_run.stdout
    assert "CPU work, not GPU work: " in done_run.stdout

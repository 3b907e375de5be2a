"""Job scripts on the web: the script editor, submit again, clone and edit, saved
templates (own and lab-wide) and job arrays, each refused clearly and nothing stored."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, transaction
from django.test import Client
from django.urls import reverse

from jobqueue.job_templates import job_template_save
from jobqueue.models import Job, JobTemplate, VolumeMount
from tests.jobqueue.test_submit import submit

pytestmark = pytest.mark.django_db

SUBMIT = "/jobs/submit/"


def form_data(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "queue": "normal",
        "image": "labportal/busybox:test",
        "command": "python train.py",
        "gpus": "1",
        "cpus": "4",
        "memory_gb": "16",
    }
    data.update(overrides)
    return data


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_multi_line_script_is_stored_as_shell_text(alice: Any, cluster: Any, image: Any) -> None:
    script = "cd /data\r\n# don't forget the seed\r\npython train.py --seed 1\r\n"
    response = logged_in(alice).post(SUBMIT, form_data(command=script))
    assert response.status_code == 302
    job = Job.objects.get(owner=alice)
    assert job.command == [
        "/bin/sh",
        "-c",
        "cd /data\n# don't forget the seed\npython train.py --seed 1",
    ]
    page = logged_in(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert "cd /data\n# don&#x27;t forget the seed\npython train.py --seed 1" in page


def test_the_script_editor_is_a_textarea_without_a_maxlength(alice: Any, image: Any) -> None:
    page = logged_in(alice).get(SUBMIT).content.decode()
    assert '<textarea name="command"' in page
    assert 'class="script"' in page
    assert "maxlength" not in page.split('<textarea name="command"')[1].split(">")[0]


def test_a_script_over_the_limit_is_refused_with_the_limit(
    alice: Any, cluster: Any, image: Any
) -> None:
    response = logged_in(alice).post(SUBMIT, form_data(command="echo x\n" * 1200))
    assert response.status_code == 400
    assert "at most 8000 are allowed" in response.content.decode()
    assert not Job.objects.exists()


def test_submit_again_queues_the_same_spec_as_a_new_job(
    alice: Any, cluster: Any, image: Any
) -> None:
    VolumeMount.objects.create(name="home", source_template="/data/{username}", target="/data")
    first = submit(
        alice,
        command="cd /data\npython train.py",
        env={"SEED": "1"},
        mounts=["home"],
        time_limit_s=7200,
        memory_mb=32768,
        name="sweep",
        preemptible=True,
    )
    response = logged_in(alice).post(f"/jobs/{first.pk}/again/")
    again = Job.objects.exclude(pk=first.pk).get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{again.pk}/"
    for field in ("command", "env", "gpus", "time_limit_s", "memory_mb", "cpus", "name"):
        assert getattr(again, field) == getattr(first, field), field
    assert again.preemptible and again.queue == first.queue and again.image == first.image
    assert [m.name for m in again.mounts.all()] == ["home"]
    assert again.owner == alice and again.state == Job.State.PENDING


def test_another_member_can_neither_submit_again_nor_clone(
    alice: Any, bob: Any, cluster: Any, image: Any
) -> None:
    job = submit(alice)
    bob_client = logged_in(bob)
    assert bob_client.post(f"/jobs/{job.pk}/again/").status_code == 404
    assert bob_client.get(f"{SUBMIT}?clone={job.pk}").status_code == 404
    assert bob_client.get(f"{SUBMIT}?clone=nonsense").status_code == 404
    assert bob_client.get(f"/jobs/{job.pk}/again/").status_code == 405
    assert Job.objects.count() == 1


def test_staff_may_clone_any_job(alice: Any, admin_user: Any, cluster: Any, image: Any) -> None:
    job = submit(alice, command="echo staff can see")
    page = logged_in(admin_user).get(f"{SUBMIT}?clone={job.pk}").content.decode()
    assert "echo staff can see" in page


def test_a_refused_submit_again_shows_the_reason_on_the_job_page(
    alice: Any, cluster: Any, image: Any
) -> None:
    job = submit(alice)
    image.enabled = False
    image.save()
    response = logged_in(alice).post(f"/jobs/{job.pk}/again/", follow=True)
    assert response.status_code == 200
    assert "not on the lab&#x27;s allowlist" in response.content.decode()
    assert Job.objects.count() == 1


def test_clone_and_edit_fills_the_form_in_from_the_job(
    alice: Any, cluster: Any, image: Any
) -> None:
    VolumeMount.objects.create(name="home", source_template="/data/{username}", target="/data")
    job = submit(
        alice,
        command="cd /data\npython eval.py",
        env={"A": "1", "B": "two"},
        mounts=["home"],
        time_limit_s=5400,
        memory_mb=65536,
        gpus=2,
        name="eval",
    )
    client = logged_in(alice)
    job_page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert f"{SUBMIT}?clone={job.pk}" in job_page and f"/jobs/{job.pk}/again/" in job_page
    form = client.get(f"{SUBMIT}?clone={job.pk}").context["form"]
    assert form["command"].value() == "cd /data\npython eval.py"
    assert form["env"].value() == "A=1\nB=two"
    assert form["gpus"].value() == 2
    assert str(form["time_limit_hours"].value()) == "1.50"
    assert form["memory_gb"].value() == 64
    assert form["mounts"].value() == ["home"]
    assert form["name"].value() == "eval"
    assert form["queue"].value() == "normal"


def test_a_member_saves_a_template_and_picks_it(alice: Any, cluster: Any, image: Any) -> None:
    client = logged_in(alice)
    response = client.post(
        SUBMIT,
        form_data(command="cd /x\r\nmake", env="A=1", save_as_name="nightly", save_template="1"),
    )
    template = JobTemplate.objects.get(owner=alice, name="nightly")
    assert response.status_code == 302
    assert response["Location"] == f"{SUBMIT}?template={template.pk}"
    assert template.fields["command"] == "cd /x\nmake"
    assert not Job.objects.exists()
    form = client.get(f"{SUBMIT}?template={template.pk}").context["form"]
    assert form["command"].value() == "cd /x\nmake" and form["env"].value() == "A=1"
    # The same name again replaces it.
    client.post(SUBMIT, form_data(command="make all", save_as_name="nightly", save_template="1"))
    assert JobTemplate.objects.get(owner=alice, name="nightly").fields["command"] == "make all"


def test_saving_a_template_needs_a_name(alice: Any, cluster: Any, image: Any) -> None:
    response = logged_in(alice).post(SUBMIT, form_data(save_template="1"))
    assert response.status_code == 400
    assert "Give the template a name" in response.content.decode()
    assert not JobTemplate.objects.exists()


def test_templates_own_and_lab_wide_are_visible_others_are_not(
    alice: Any, bob: Any, cluster: Any, image: Any
) -> None:
    mine, _ = job_template_save(owner=alice, name="mine", fields=form_data())
    bobs, _ = job_template_save(owner=bob, name="bobs", fields=form_data())
    lab = JobTemplate.objects.create(name="lab default", fields=form_data(command="nvidia-smi"))
    client = logged_in(alice)
    page = client.get(SUBMIT)
    assert set(page.context["templates"]) == {mine, lab}
    assert "bobs" not in page.content.decode()
    assert client.get(f"{SUBMIT}?template={lab.pk}").context["form"]["command"].value() == (
        "nvidia-smi"
    )
    assert client.get(f"{SUBMIT}?template={bobs.pk}").status_code == 404
    assert client.get(f"{SUBMIT}?template=x").status_code == 404


def test_a_member_deletes_own_templates_only(
    alice: Any, bob: Any, cluster: Any, image: Any
) -> None:
    mine, _ = job_template_save(owner=alice, name="mine", fields=form_data())
    bobs, _ = job_template_save(owner=bob, name="bobs", fields=form_data())
    lab = JobTemplate.objects.create(name="lab default", fields=form_data())
    client = logged_in(alice)
    assert client.post(f"/jobs/templates/{bobs.pk}/delete/").status_code == 404
    assert client.post(f"/jobs/templates/{lab.pk}/delete/").status_code == 404
    assert client.post(f"/jobs/templates/{mine.pk}/delete/").status_code == 302
    assert set(JobTemplate.objects.all()) == {bobs, lab}


def test_a_template_is_checked_again_when_submitted(alice: Any, cluster: Any, image: Any) -> None:
    # A lab-wide template made in the admin may hold anything; the form still decides.
    JobTemplate.objects.create(name="odd", fields=form_data(gpus="999", env="no equals sign"))
    response = logged_in(alice).post(SUBMIT, form_data(gpus="999", env="no equals sign"))
    assert response.status_code == 400
    assert not Job.objects.exists()


def test_save_as_names_are_unique_per_owner_and_lab_wide(alice: Any, bob: Any) -> None:
    JobTemplate.objects.create(owner=alice, name="t")
    JobTemplate.objects.create(owner=bob, name="t")
    JobTemplate.objects.create(owner=None, name="t")
    for owner in (alice, None):
        with pytest.raises(IntegrityError), transaction.atomic():
            JobTemplate.objects.create(owner=owner, name="t")


def test_only_staff_manage_templates_in_the_admin(alice: Any, admin_user: Any) -> None:
    url = reverse("admin:jobqueue_jobtemplate_changelist")
    assert logged_in(alice).get(url).status_code == 302
    assert logged_in(admin_user).get(url).status_code == 200


def test_an_array_submits_one_job_per_index(alice: Any, cluster: Any, image: Any) -> None:
    response = logged_in(alice).post(SUBMIT, form_data(array="0-3", name="sweep"), follow=True)
    jobs = list(Job.objects.order_by("pk"))
    assert [j.env["LABPORTAL_ARRAY_INDEX"] for j in jobs] == ["0", "1", "2", "3"]
    assert [j.name for j in jobs] == ["sweep[0]", "sweep[1]", "sweep[2]", "sweep[3]"]
    assert response.redirect_chain[-1][0] == f"/jobs/{jobs[0].pk}/"
    assert "4 jobs submitted" in response.content.decode()


def test_an_array_of_listed_indices_keeps_the_environment(
    alice: Any, cluster: Any, image: Any
) -> None:
    logged_in(alice).post(SUBMIT, form_data(array="1,4,7", env="SEED=3"))
    envs = [j.env for j in Job.objects.order_by("pk")]
    assert envs == [{"SEED": "3", "LABPORTAL_ARRAY_INDEX": i} for i in ("1", "4", "7")]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("0-", "is not an array range"),
        ("a,b", "is not an array range"),
        ("9-3", "counts down; write it as 3-9"),
        ("0-1000", "An array holds at most 1000 jobs"),
        ("0-99999999999", "An array holds at most 1000 jobs"),
    ],
)
def test_a_bad_array_is_refused_with_what_to_fix(
    alice: Any, cluster: Any, image: Any, spec: str, message: str
) -> None:
    response = logged_in(alice).post(SUBMIT, form_data(array=spec))
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not Job.objects.exists()


def test_an_array_is_queued_whole_or_not_at_all(
    alice: Any, cluster: Any, image: Any, phd_category: Any
) -> None:
    phd_category.max_queued_jobs = 2
    phd_category.save()
    response = logged_in(alice).post(SUBMIT, form_data(array="0-3"))
    assert response.status_code == 400
    assert "This array of 4 jobs would take you past the 2 waiting jobs" in (
        response.content.decode()
    )
    assert not Job.objects.exists()

"""Submitting, watching and cancelling jobs with labctl against a live portal."""

from __future__ import annotations

from typing import Any

import pytest

from tests.labctl.conftest import Run, token_for

pytestmark = pytest.mark.django_db(transaction=True)

IMAGE = "labportal/busybox:test"


def submit(labctl: Run, *extra: str) -> dict[str, Any]:
    result = labctl(
        "--json", "submit", "--image", "labportal/busybox:test", *extra, "--", "sleep", "60"
    )
    assert result.code == 0, result.err
    return result.json()


def test_alice_submits_sees_and_cancels_a_job(labctl: Run, as_alice: str) -> None:
    result = labctl(
        "submit",
        "--image",
        "labportal/busybox:test",
        "--gpus",
        "2",
        "--time",
        "90m",
        "--memory",
        "8G",
        "--env",
        "EPOCHS=3",
        "--name",
        "resnet",
        "--",
        "python",
        "train.py",
        "--lr",
        "3e-4",
    )
    assert result.code == 0, result.err
    assert "Submitted job" in result.out
    assert "queue position" in result.out and "estimated start" in result.out
    job_id = int(result.out.split("Submitted job ")[1].split()[0])

    listing = labctl("status")
    assert listing.code == 0
    assert "resnet" in listing.out and "pending" in listing.out

    details = labctl("--json", "status", str(job_id)).json()
    assert details["command"] == ["python", "train.py", "--lr", "3e-4"]
    assert details["gpus"] == 2 and details["time_limit_s"] == 5400 and details["memory_mb"] == 8192
    assert details["env"] == {"EPOCHS": "3"}
    assert isinstance(details["events"], list)
    assert (
        "Events" in labctl("status", str(job_id)).out
        or "No events" in labctl("status", str(job_id)).out
    )

    cancelled = labctl("cancel", str(job_id))
    assert cancelled.code == 0, cancelled.err
    assert "cancelled" in cancelled.out
    assert labctl("--json", "status", str(job_id)).json()["state"] == "cancelled"
    assert "resnet" not in labctl("status").out
    assert "resnet" in labctl("status", "--all").out


def test_an_image_off_the_allowlist_exits_1_with_the_portals_message(
    labctl: Run, as_alice: str
) -> None:
    result = labctl("submit", "--image", "evil/miner:latest", "--", "mine")
    assert result.code == 1
    assert "not on the lab's allowlist" in result.err
    assert "labportal/busybox:test" in result.err
    assert "Traceback" not in result.err


def test_a_field_error_is_printed_with_its_field(labctl: Run, as_alice: str) -> None:
    result = labctl("submit", "--image", "labportal/busybox:test", "--gpus", "0", "--", "true")
    assert result.code == 1
    assert result.err.startswith("error: gpus:")


def test_submit_without_a_command_is_a_usage_error(labctl: Run, as_alice: str) -> None:
    result = labctl("submit", "--image", "labportal/busybox:test")
    assert result.code == 2
    assert "after --" in result.err


def test_charlie_cannot_cancel_alices_job(labctl: Run, as_alice: str, charlie: Any) -> None:
    job = submit(labctl)
    result = labctl("--token", token_for(charlie), "cancel", str(job["id"]))
    assert result.code == 1
    assert "not found" in result.err.lower()
    assert labctl("--json", "status", str(job["id"])).json()["state"] == "pending"


def test_cancelling_several_jobs_reports_each_and_fails_if_one_fails(
    labctl: Run, as_alice: str
) -> None:
    first, second = submit(labctl), submit(labctl)
    result = labctl("cancel", str(first["id"]), "999999", str(second["id"]))
    assert result.code == 1
    assert f"Job {first['id']}: cancelled" in result.out
    assert f"Job {second['id']}: cancelled" in result.out
    assert "999999" in result.err


def test_json_output_parses_for_scripts(labctl: Run, as_alice: str) -> None:
    job = submit(labctl, "--name", "scripted")
    assert job["name"] == "scripted" and job["owner"] == "alice"
    jobs = labctl("status", "--json").json()
    assert [j["id"] for j in jobs] == [job["id"]]
    overview = labctl("--json", "queue").json()
    assert set(overview) == {"waiting", "waiting_total", "running"}
    logs = labctl("--json", "logs", str(job["id"])).json()
    assert logs["job"] == job["id"] and logs["state"] == "pending"


def test_the_queue_overview_lists_waiting_jobs(labctl: Run, as_alice: str) -> None:
    job = submit(labctl)
    result = labctl("queue")
    assert result.code == 0
    assert "Waiting (1)" in result.out and "alice" in result.out and str(job["id"]) in result.out


def test_logs_follow_stops_when_the_job_is_final(
    labctl: Run, as_alice: str, monkeypatch: Any
) -> None:
    from jobqueue.models import Job

    job = submit(labctl)
    Job.objects.filter(pk=job["id"]).update(log_tail="epoch 1\n")
    polls = []

    def finish_on_first_poll(_seconds: float) -> None:
        polls.append(_seconds)
        Job.objects.filter(pk=job["id"]).update(
            log_tail="epoch 1\nepoch 2\ndone\n", state="completed"
        )

    monkeypatch.setattr("labctl.cli.time.sleep", finish_on_first_poll)
    result = labctl("logs", str(job["id"]), "--follow")
    assert result.code == 0, result.err
    assert result.out == "epoch 1\nepoch 2\ndone\n"
    assert polls == [2.0]
    assert "completed" in result.err


def test_an_array_queues_one_job_per_index_with_its_index(labctl: Run, as_alice: str) -> None:
    from jobqueue.models import Job

    result = labctl(
        "submit",
        "--image",
        IMAGE,
        "--array",
        "0-2,7",
        "--name",
        "sweep",
        "--",
        "python",
        "sweep.py",
    )

    assert result.code == 0, result.err
    assert "Submitted 4 jobs" in result.out
    jobs = Job.objects.order_by("pk")
    assert [j.env["LABPORTAL_ARRAY_INDEX"] for j in jobs] == ["0", "1", "2", "7"]
    assert [j.name for j in jobs] == ["sweep[0]", "sweep[1]", "sweep[2]", "sweep[7]"]
    assert {j.array_id for j in jobs} == {jobs[0].pk}
    assert f"(array {jobs[0].pk})" in result.out


def test_cancel_array_cancels_every_job_of_the_array_still_waiting(
    labctl: Run, as_alice: str
) -> None:
    from jobqueue.models import Job

    assert labctl("submit", "--image", IMAGE, "--array", "0-2", "--", "true").code == 0
    first, second, third = Job.objects.order_by("pk")
    assert labctl("cancel", str(second.pk)).code == 0
    result = labctl("cancel", str(third.pk), "--array")
    assert result.code == 0, result.err
    assert f"Job {first.pk}: cancelled." in result.out
    assert f"Job {third.pk}: cancelled." in result.out
    assert set(Job.objects.values_list("state", flat=True)) == {"cancelled"}
    again = labctl("cancel", str(first.pk), "--array")
    assert again.code == 0 and "every job has already ended" in again.out


def test_an_array_with_a_refused_job_queues_none(labctl: Run, as_alice: str) -> None:
    from jobqueue.models import Job

    result = labctl("submit", "--image", IMAGE, "--gpus", "6", "--array", "0-1", "--", "true")

    assert result.code == 1
    assert "No node has 6 matching GPUs" in result.err
    assert not Job.objects.exists()


def test_status_with_a_limit_below_one_is_a_usage_error(labctl: Run, as_alice: str) -> None:
    result = labctl("status", "--limit", "0")
    assert result.code == 2
    assert "whole number of 1 or more" in result.err


def test_a_command_over_the_portals_limit_is_refused_before_it_is_sent(
    labctl: Run, as_alice: str
) -> None:
    from jobqueue.models import Job

    result = labctl("submit", "--image", IMAGE, "--", "python", "x" * 8000)
    assert result.code == 2
    assert result.err.strip().endswith(
        "The command is 8007 characters long; at most 8000 are allowed. "
        "Put the work in a script and run the script."
    )
    assert not Job.objects.exists()


def test_logs_prints_the_whole_log_and_follows_it_by_offset_until_it_is_complete(
    labctl: Run, as_alice: str, monkeypatch: Any
) -> None:
    from joblogs.services import job_log_append
    from jobqueue.models import Job

    job = submit(labctl)
    Job.objects.filter(pk=job["id"]).update(state="running")
    job_log_append(job_id=job["id"], stream="c1", offset=0, data=b"one\ntwo\n")
    polls = []

    def more_on_first_poll(seconds: float) -> None:
        polls.append(seconds)
        job_log_append(job_id=job["id"], stream="c1", offset=8, data=b"three\n", final=True)
        Job.objects.filter(pk=job["id"]).update(state="completed")

    monkeypatch.setattr("labctl.cli.time.sleep", more_on_first_poll)
    result = labctl("logs", str(job["id"]), "-f")
    assert result.code == 0, result.err
    assert result.out == "one\ntwo\nthree\n"
    assert polls == [2.0]
    assert labctl("logs", str(job["id"]), "--tail", "1").out == "three\n"


def test_a_reader_that_stops_reading_gets_no_traceback(as_alice: str, portal: str) -> None:
    """`labctl queue | head -1`: the pipe closes before labctl writes; it exits 141 quietly."""
    import os
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "labctl", "queue"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "LABPORTAL_URL": portal, "LABPORTAL_TOKEN": as_alice},
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the only reader is gone: every write meets a broken pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err


def test_cancelling_a_running_job_says_it_is_being_stopped_not_that_it_runs(
    labctl: Run, as_alice: str
) -> None:
    from jobqueue.models import Job

    job = submit(labctl)
    Job.objects.filter(pk=job["id"]).update(state="running")
    result = labctl("cancel", str(job["id"]))
    assert result.code == 0, result.err
    assert result.out.startswith(f"Job {job['id']}: cancel requested; it is being stopped")
    assert f"labctl status {job['id']}" in result.out
    assert ": running." not in result.out
    assert Job.objects.get(pk=job["id"]).stop_requested_at is not None


def test_submit_charges_a_project_and_status_shows_it(
    labctl: Run, as_alice: str, alice: Any
) -> None:
    from accounts.models import Project

    Project.objects.create(name="nsfc-vision", title="Vision grant", pi=alice)
    job = submit(labctl, "--project", "nsfc-vision")
    assert job["project"] == "nsfc-vision"
    assert "project" in labctl("status", str(job["id"])).out
    assert "nsfc-vision" in labctl("status", str(job["id"])).out

    refused = labctl("submit", "--image", IMAGE, "--project", "nope", "--", "true")
    assert refused.code == 1
    assert "There is no project “nope”. Your projects: nsfc-vision." in refused.err

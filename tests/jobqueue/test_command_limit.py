"""One limit on a command, refused in the same words by the web form, the API and labctl."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from jobqueue import errors
from jobqueue.models import MAX_COMMAND_ARGS, MAX_COMMAND_CHARS, Job, command_limit_refusal
from labctl import limits as labctl_limits
from tests.conftest import api_as
from tests.jobqueue.test_submit import submit

pytestmark = pytest.mark.django_db

TOO_LONG = (
    f"The command is {MAX_COMMAND_CHARS + 1} characters long; at most {MAX_COMMAND_CHARS} "
    "are allowed. Put the work in a script and run the script."
)
TOO_MANY = (
    f"The command has {MAX_COMMAND_ARGS + 1} arguments; at most {MAX_COMMAND_ARGS} are "
    "allowed. Put the work in a script and run the script."
)
# Each is one character over: a line, a list whose arguments and spaces add up to one
# more, and a list of short arguments one too many.
LINE_OVER = "x" * (MAX_COMMAND_CHARS + 1)
LIST_OVER = ["python", "x" * (MAX_COMMAND_CHARS - len("python"))]
ARGS_OVER = ["x"] * (MAX_COMMAND_ARGS + 1)


def api_submit(user: Any, command: Any) -> Any:
    return api_as(user).post(
        "/api/jobs/", {"image": "labportal/busybox:test", "command": command}, format="json"
    )


@pytest.mark.parametrize(
    ("command", "message"),
    [(LINE_OVER, TOO_LONG), (LIST_OVER, TOO_LONG), (ARGS_OVER, TOO_MANY)],
    ids=["line", "list", "arguments"],
)
def test_the_api_refuses_a_command_over_the_limit_naming_the_field_and_the_limit(
    alice: Any, cluster: Any, image: Any, command: Any, message: str
) -> None:
    response = api_submit(alice, command)
    assert response.status_code == 400
    assert json.loads(response.content) == {"command": [message]}
    assert not Job.objects.exists()


def test_the_api_refuses_a_million_arguments_before_looking_at_each(
    alice: Any, cluster: Any, image: Any
) -> None:
    response = api_submit(alice, ["x"] * 1_000_000)
    assert response.status_code == 400
    assert "The command has 1000000 arguments; at most 1000" in response.content.decode()


def test_a_command_at_the_limit_is_accepted_whole(alice: Any, cluster: Any, image: Any) -> None:
    line = "echo " + "x" * (MAX_COMMAND_CHARS - len("echo "))
    assert api_submit(alice, line).status_code == 201
    arguments = ["x"] * MAX_COMMAND_ARGS
    assert api_submit(alice, arguments).status_code == 201
    assert [j.command_display for j in Job.objects.order_by("pk")] == [line, " ".join(arguments)]


@pytest.mark.parametrize("command", [LINE_OVER, LIST_OVER, ARGS_OVER], ids=["line", "list", "args"])
def test_the_service_refuses_what_the_api_refuses(
    alice: Any, cluster: Any, image: Any, command: Any
) -> None:
    with pytest.raises(errors.JobRefused) as refused:
        submit(alice, command=command)
    assert refused.value.message == command_limit_refusal(command)


def test_the_web_form_refuses_a_long_command_instead_of_cutting_it_short(
    client: Client, alice: Any, cluster: Any, image: Any
) -> None:
    client.force_login(alice)
    page = client.get(reverse("job_submit")).content.decode()
    # A maxlength on the input made the browser drop the rest of a paste without a word.
    assert 'name="command"' in page and 'maxlength="8000"' not in page
    response = client.post(
        reverse("job_submit"),
        {
            "queue": "normal",
            "image": "labportal/busybox:test",
            "command": LINE_OVER,
            "gpus": 1,
            "cpus": "4",
            "memory_gb": "16",
        },
    )
    assert response.status_code == 400
    assert TOO_LONG in response.content.decode()
    assert not Job.objects.exists()


def test_labctl_keeps_the_portals_limit_and_its_words() -> None:
    assert (labctl_limits.MAX_COMMAND_CHARS, labctl_limits.MAX_COMMAND_ARGS) == (
        MAX_COMMAND_CHARS,
        MAX_COMMAND_ARGS,
    )
    for argv in (LIST_OVER, ARGS_OVER, ["python", "train.py"]):
        assert labctl_limits.command_limit_refusal(argv) == command_limit_refusal(argv)

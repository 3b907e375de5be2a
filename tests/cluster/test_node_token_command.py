"""manage.py node_token: enrol a GPU server without the admin (Ansible captures the secret)."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from cluster.models import NodeToken

pytestmark = pytest.mark.django_db


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("node_token", *args, stdout=out, stderr=err)
    return out.getvalue().strip(), err.getvalue().strip()


def test_issue_prints_only_a_secret_the_agent_is_accepted_with() -> None:
    secret, note = run("issue", "gpu-01")
    assert secret.startswith("lpn_") and "\n" not in secret
    assert NodeToken.matches(node_name="gpu-01", secret=secret)
    assert not NodeToken.matches(node_name="gpu-02", secret=secret)
    assert "not shown again" in note


def test_issue_as_json_for_a_playbook() -> None:
    out, _ = run("issue", "gpu-01", "--name", "rack 3", "--json")
    record = json.loads(out)
    assert record["node"] == "gpu-01" and record["name"] == "rack 3"
    assert NodeToken.matches(node_name="gpu-01", secret=record["token"])


def test_a_name_that_is_no_node_name_is_refused_with_the_form_to_use() -> None:
    with pytest.raises(CommandError, match="letters, digits, hyphens"):
        run("issue", "gpu 01;rm")
    assert not NodeToken.objects.exists()


def test_revoke_refuses_the_agent_from_then_on_and_list_shows_it() -> None:
    secret, _ = run("issue", "gpu-01")
    run("issue", "gpu-02")
    out, _ = run("revoke", "gpu-01")
    assert "Revoked 1 token(s) of gpu-01" in out
    assert not NodeToken.matches(node_name="gpu-01", secret=secret)
    live, _ = run("list")
    assert [line.split("\t")[0] for line in live.splitlines()] == ["gpu-02"]
    every, _ = run("list", "--all")
    assert "revoked" in every and "gpu-01" in every
    with pytest.raises(CommandError, match="no live node token"):
        run("revoke", "gpu-01")

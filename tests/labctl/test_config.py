"""Where the URL and token come from, and what happens when they are missing or wrong."""

from __future__ import annotations

import os
import socket
import stat
from typing import Any

import pytest

from tests.labctl.conftest import Run, token_for


def test_without_a_token_labctl_exits_2_and_says_to_log_in_and_where_to_make_one(
    labctl: Run,
) -> None:
    result = labctl("--url", "http://portal.invalid:8000", "status")
    assert result.code == 2
    assert "labctl login" in result.err
    assert "http://portal.invalid:8000/account/tokens/" in result.err
    assert "Traceback" not in result.err


def test_without_any_configuration_labctl_exits_2_and_explains_login(labctl: Run) -> None:
    result = labctl("queue")
    assert result.code == 2
    assert "labctl login --url" in result.err


def test_a_portal_nobody_listens_on_exits_3(labctl: Run) -> None:
    with socket.socket() as sock:  # a port that was free a moment ago
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = labctl("--url", f"http://127.0.0.1:{port}", "--token", "lp_x", "status")
    assert result.code == 3
    assert "Cannot reach the portal" in result.err
    assert "Traceback" not in result.err


def test_a_url_without_a_scheme_is_a_usage_error(labctl: Run) -> None:
    result = labctl("--url", "portal:8000", "--token", "lp_x", "status")
    assert result.code == 2
    assert "http://" in result.err


@pytest.mark.django_db(transaction=True)
def test_login_checks_the_token_and_stores_it_readable_only_by_the_user(
    labctl: Run, live_server: Any, alice: Any, isolated_config: Any
) -> None:
    token = token_for(alice)
    result = labctl("login", "--url", live_server.url, "--token", token)
    assert result.code == 0, result.err
    assert "as alice" in result.out
    assert stat.S_IMODE(os.stat(isolated_config).st_mode) == 0o600
    # The stored settings are used from now on.
    assert labctl("credits").code == 0


@pytest.mark.django_db(transaction=True)
def test_login_with_an_unknown_token_stores_nothing_and_exits_1(
    labctl: Run, live_server: Any, isolated_config: Any
) -> None:
    result = labctl("login", "--url", live_server.url, "--token", "lp_not-a-real-token")
    assert result.code == 1
    assert "unknown, expired or revoked" in result.err
    assert not isolated_config.exists()


@pytest.mark.django_db(transaction=True)
def test_environment_variables_override_the_config_file(
    labctl: Run, live_server: Any, alice: Any, charlie: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert labctl("login", "--url", live_server.url, "--token", token_for(alice)).code == 0
    monkeypatch.setenv("LABPORTAL_TOKEN", token_for(charlie))
    assert labctl("--json", "credits").json()["credits"]["username"] == "charlie"


def test_python_dash_m_labctl_runs_as_a_program_and_exits_3_without_a_traceback(
    tmp_path: Any,
) -> None:
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "LABCTL_CONFIG": str(tmp_path / "c.json"), "PYTHONPATH": str(root)}
    env.pop("LABPORTAL_TOKEN", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "labctl",
            "--url",
            f"http://127.0.0.1:{port}",
            "--token",
            "lp_x",
            "queue",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=30,
        check=False,
    )
    assert done.returncode == 3
    assert "Cannot reach the portal" in done.stderr and "Traceback" not in done.stderr

"""labctl against a real portal: pytest-django's live_server, real tokens, labctl.cli.main in-process."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from labctl.cli import main


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


Run = Callable[..., Result]


def token_for(user: Any) -> str:
    from accounts.models import PersonalAccessToken

    _token, secret = PersonalAccessToken.issue(user=user, name="labctl tests")
    return secret


@pytest.fixture(autouse=True)
def isolated_config(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Each test has its own config file and no LABPORTAL_* from the environment."""
    path = tmp_path / "labctl" / "config.json"
    monkeypatch.setenv("LABCTL_CONFIG", str(path))
    monkeypatch.delenv("LABPORTAL_URL", raising=False)
    monkeypatch.delenv("LABPORTAL_TOKEN", raising=False)
    return path


@pytest.fixture
def labctl(capsys: pytest.CaptureFixture[str]) -> Run:
    """Runs `labctl ARGS...` in-process and returns its exit code, stdout and stderr."""

    def run(*args: str) -> Result:
        capsys.readouterr()
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture
def portal(live_server: Any, cluster: Any, image: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """The live portal's URL, with two nodes of four GPUs and the test image on the allowlist."""
    monkeypatch.setenv("LABPORTAL_URL", live_server.url)
    return str(live_server.url)


@pytest.fixture
def as_alice(portal: str, alice: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    token = token_for(alice)
    monkeypatch.setenv("LABPORTAL_TOKEN", token)
    return token

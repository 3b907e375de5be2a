"""The gateway's options: where it listens, what it advertises, and what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import ConfigError, load_config
from protocol import wire
from protocol.messages import NodeInfo

BASE = [
    "--name",
    "gpu01",
    "--broker",
    "redis://x:6379/0",
    "--token",
    "t",
    "--allowed-mount-root",
    "none",
]


def test_without_gateway_listen_there_is_no_gateway() -> None:
    cfg = load_config(BASE, {})

    assert (cfg.gateway_listen, cfg.gateway_url) == (None, None)


@pytest.mark.parametrize(
    ("argv", "env", "listen", "url"),
    [
        (["--gateway-listen", "10.0.0.5:8765"], {}, ("10.0.0.5", 8765), "http://10.0.0.5:8765"),
        (
            [],
            {"LABPORTAL_AGENT_GATEWAY_LISTEN": "[fd00::5]:9000"},
            ("fd00::5", 9000),
            "http://[fd00::5]:9000",
        ),
        (
            ["--gateway-listen", "10.0.0.5:8765", "--gateway-url", "https://gpu01.lab:443/"],
            {},
            ("10.0.0.5", 8765),
            "https://gpu01.lab:443",
        ),
        (
            ["--gateway-listen", "0.0.0.0:8765", "--gateway-listen-all"],
            {"LABPORTAL_AGENT_GATEWAY_URL": "http://10.0.0.5:8765"},
            ("0.0.0.0", 8765),
            "http://10.0.0.5:8765",
        ),
    ],
)
def test_the_gateway_listens_where_told_and_advertises_its_url(
    argv: list[str], env: dict[str, str], listen: tuple[str, int], url: str
) -> None:
    cfg = load_config(BASE + argv, env)

    assert (cfg.gateway_listen, cfg.gateway_url) == (listen, url)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gateway-listen", "8765"], "HOST:PORT"),
        (["--gateway-listen", "10.0.0.5:99999"], "HOST:PORT"),
        (["--gateway-listen", "0.0.0.0:8765"], "--gateway-listen-all"),
        (["--gateway-listen", ":8765"], "--gateway-listen-all"),
        (["--gateway-listen", "0.0.0.0:8765", "--gateway-listen-all"], "--gateway-url"),
        (["--gateway-url", "http://10.0.0.5:8765"], "without --gateway-listen"),
        (["--gateway-listen", "10.0.0.5:1", "--gateway-url", "http://h/path"], "no path"),
        (["--gateway-listen", "10.0.0.5:1", "--monitor-only"], "monitor-only"),
    ],
)
def test_a_bad_gateway_setting_is_refused_saying_how_to_fix_it(
    argv: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(BASE + argv, {})


def test_the_agent_registers_its_gateway_url_as_the_wire_accepts_it(tmp_path: Path) -> None:
    from agent.runtime.local import LocalProcessRuntime
    from tests.agent.support import make_agent

    node_agent, _ = make_agent(LocalProcessRuntime(tmp_path, enabled=True), "gpu01")
    assert node_agent.node_info()["gateway"] is None

    node_agent.gateway_url = "http://10.0.0.5:8765"
    info = wire.decode(NodeInfo, node_agent.node_info())
    assert info.gateway == "http://10.0.0.5:8765"

"""The firewall rule that keeps session containers from the node's own services."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from agent.runtime.docker_exec import GUARD_RULE, SessionGuardError, guard_session_bridge


class FakeFirewall:
    def __init__(self, *, present: bool = False, insert_fails: set[str] | None = None) -> None:
        self.rules: dict[str, bool] = {"iptables": present, "ip6tables": present}
        self.insert_fails = insert_fails or set()
        self.calls: list[list[str]] = []

    def run(self, argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        tool, action, rule = argv[0].rsplit("/", 1)[-1], argv[2], tuple(argv[3:])
        assert argv[1] == "-w" and rule == GUARD_RULE
        if action == "-C":
            return subprocess.CompletedProcess(argv, 0 if self.rules[tool] else 1, "", "")
        if tool in self.insert_fails:
            return subprocess.CompletedProcess(argv, 4, "", "Permission denied (you must be root)")
        self.rules[tool] = True
        return subprocess.CompletedProcess(argv, 0, "", "")


def test_the_rule_is_inserted_once_in_both_firewalls() -> None:
    fw = FakeFirewall()
    guard_session_bridge(run=fw.run, which=lambda t: f"/usr/sbin/{t}")
    assert fw.rules == {"iptables": True, "ip6tables": True}
    inserted = len(fw.calls)
    guard_session_bridge(run=fw.run, which=lambda t: f"/usr/sbin/{t}")
    # The second time only checks: nothing is inserted twice.
    assert [c[2] for c in fw.calls[inserted:]] == ["-C", "-C"]


def test_a_session_does_not_start_without_the_ipv4_rule() -> None:
    with pytest.raises(SessionGuardError, match="must run as root"):
        guard_session_bridge(
            run=FakeFirewall(insert_fails={"iptables"}).run, which=lambda t: f"/usr/sbin/{t}"
        )
    with pytest.raises(SessionGuardError, match="install iptables"):
        guard_session_bridge(run=FakeFirewall().run, which=lambda t: None)


def test_ipv6_is_guarded_where_the_host_can(caplog: pytest.LogCaptureFixture) -> None:
    fw = FakeFirewall(insert_fails={"ip6tables"})
    guard_session_bridge(run=fw.run, which=lambda t: f"/usr/sbin/{t}")
    assert fw.rules["iptables"] and "IPv6 rule" in caplog.text
    no_v6 = FakeFirewall()
    guard_session_bridge(
        run=no_v6.run, which=lambda t: f"/usr/sbin/{t}" if t == "iptables" else None
    )
    assert no_v6.rules["iptables"] and {c[0] for c in no_v6.calls} == {"/usr/sbin/iptables"}

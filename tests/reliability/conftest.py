"""Fixtures of the reliability tests: the agent's Docker fixtures, for the tests that
attack a real engine, and the private lab (PostgreSQL, Redis, a control worker and an
agent) of the outage tests, which the malformed-message tests use too."""

from tests.agent.conftest import docker_client, docker_runtime, node_name
from tests.reliability.test_outages import start_lab

__all__ = ["docker_client", "docker_runtime", "node_name", "start_lab"]

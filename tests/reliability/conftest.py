"""The agent's Docker fixtures, for the reliability tests that attack a real engine."""

from tests.agent.conftest import docker_client, docker_runtime, node_name

__all__ = ["docker_client", "docker_runtime", "node_name"]

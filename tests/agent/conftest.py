"""Fixtures for the agent's tests. None of them needs Django.

Docker tests use the real engine: under CI=true an unreachable engine fails
them, elsewhere it skips them with the command that starts one. NVML tests
need a real GPU; LABPORTAL_TEST_NVML=1 makes a missing one a failure.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.agent.support import SETUP_HINT, TEST_IMAGE, RecordingApp


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


@pytest.fixture
def recording_app() -> RecordingApp:
    return RecordingApp()


@pytest.fixture
def node_name() -> str:
    # Unique per test: containers of parallel runs on a shared engine never mix.
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    import docker
    from docker.errors import ImageNotFound

    def unavailable(reason: str) -> None:
        if _in_ci():
            pytest.fail(
                f"{reason}; CI=true requires the Docker engine: {SETUP_HINT}", pytrace=False
            )
        pytest.skip(f"{reason}; {SETUP_HINT}")

    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except Exception as exc:
        unavailable(f"Docker engine not reachable ({exc})")
    try:
        client.images.get(TEST_IMAGE)
    except ImageNotFound:
        unavailable(f"test image {TEST_IMAGE} is missing")
    yield client
    client.close()


@pytest.fixture
def docker_runtime(docker_client: Any, node_name: str) -> Iterator[Any]:
    from agent.runtime.docker_runtime import DockerRuntime

    runtime = DockerRuntime(node_name, client=docker_client)
    yield runtime
    runtime.stop_following_exits()  # the client is shared: close() would close it
    for container in docker_client.containers.list(
        all=True, filters={"label": f"labportal.node={node_name}"}
    ):
        container.remove(force=True)


@pytest.fixture
def nvml_backend() -> Iterator[Any]:
    from agent.gpu.base import GpuBackendUnavailable
    from agent.gpu.nvml import NvmlBackend

    try:
        backend = NvmlBackend()
    except GpuBackendUnavailable as exc:
        if os.environ.get("LABPORTAL_TEST_NVML") == "1":
            pytest.fail(f"LABPORTAL_TEST_NVML=1 but {exc}", pytrace=False)
        pytest.skip(f"no NVIDIA GPU here ({exc}); set LABPORTAL_TEST_NVML=1 on a GPU machine")
    yield backend
    backend.close()

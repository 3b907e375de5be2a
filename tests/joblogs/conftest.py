from __future__ import annotations

from typing import Any

import pytest

from cluster.models import Node
from tests.cluster.conftest import issue_token, job_on, registered_node  # noqa: F401


@pytest.fixture
def running_job(registered_node: Any, alice: Any) -> Any:  # noqa: F811
    node, _secret = registered_node
    return job_on(node, alice)


@pytest.fixture
def node_secret(registered_node: Any) -> str:  # noqa: F811
    return str(registered_node[1])


__all__ = ["Node"]

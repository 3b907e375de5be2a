from tests.cluster.conftest import (  # noqa: F401  (fixtures shared with the cluster tests)
    issue_token,
    jobqueue_calls,
    other_node,
    registered_node,
)

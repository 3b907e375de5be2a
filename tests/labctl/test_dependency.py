"""labctl submit --dependency afterok:12:13, as Slurm's sbatch --dependency."""

from __future__ import annotations

import pytest

from jobqueue import dependencies as portal
from labctl import parsing
from tests.labctl.conftest import Run
from tests.labctl.test_jobs import submit


def test_the_syntax_is_checked_before_sending() -> None:
    assert parsing.parse_dependency(" AfterOK:12:13:12 ") == "afterok:12:13"
    assert parsing.parse_dependency("afterany:7") == "afterany:7"
    for bad in ("after:1", "afterok", "afterok:x", "12"):
        with pytest.raises(ValueError, match="is not a dependency"):
            parsing.parse_dependency(bad)
    many = "afterok:" + ":".join(str(i) for i in range(1, 66))
    with pytest.raises(ValueError, match="at most 64 jobs"):
        parsing.parse_dependency(many)


def test_labctl_keeps_the_portals_limit_and_syntax() -> None:
    assert parsing.MAX_DEPENDENCIES == portal.MAX_DEPENDENCIES
    for text in ("afterok:12:13", "afterany:7", "afterok:3:3"):
        kind, ids = portal.parse_dependency(text)
        assert parsing.parse_dependency(text) == ":".join([kind, *map(str, ids)])


@pytest.mark.django_db(transaction=True)
def test_submit_with_a_dependency_waits_for_it(labctl: Run, as_alice: str) -> None:
    first = submit(labctl)
    second = submit(labctl, "--dependency", f"afterok:{first['id']}")
    assert second["dependency"] == f"afterok:{first['id']}"
    assert "runs after" in labctl("status", str(second["id"])).out


@pytest.mark.django_db(transaction=True)
def test_a_bad_dependency_is_a_usage_error(labctl: Run, as_alice: str) -> None:
    result = labctl("submit", "--image", "x", "--dependency", "after:1", "--", "true")
    assert result.code == 2
    assert "is not a dependency" in result.err

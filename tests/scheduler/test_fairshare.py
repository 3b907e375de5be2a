"""Slurm classic fair share: the worked example from Slurm's documentation, and decay."""

import pytest

from scheduler.fairshare import UsageRecord, decayed_usage, fairshare_factors
from scheduler.model import ShareNode


def slurm_example_tree() -> ShareNode:
    return ShareNode(
        "root",
        1,
        (
            ShareNode(
                "A",
                40,
                (
                    ShareNode("B", 30, (ShareNode("user1", 1),)),
                    ShareNode("C", 10, (ShareNode("user2", 1), ShareNode("user3", 1))),
                ),
            ),
            ShareNode(
                "D",
                60,
                (
                    ShareNode("E", 25, (ShareNode("user4", 1),)),
                    ShareNode("F", 35, (ShareNode("user5", 1),)),
                ),
            ),
        ),
    )


def test_it_reproduces_the_slurm_classic_fairshare_worked_example() -> None:
    usage = {"user1": 0.2, "user2": 0.25, "user3": 0.0, "user4": 0.25, "user5": 0.0}
    factors = fairshare_factors(slurm_example_tree(), usage, normalize=False)
    expected = {
        "user1": 0.408479,
        "user2": 0.022097,
        "user3": 0.125,
        "user4": 0.5,
        "user5": 0.749154,
    }
    for user, value in expected.items():
        assert factors[user] == pytest.approx(value, abs=1e-6), user


def test_it_gives_every_user_factor_one_when_nobody_has_used_anything() -> None:
    factors = fairshare_factors(slurm_example_tree(), {})
    assert set(factors) == {"user1", "user2", "user3", "user4", "user5"}
    assert all(value == 1.0 for value in factors.values())


def test_it_supports_trees_deeper_than_three_levels() -> None:
    tree = ShareNode(
        "root",
        1,
        (
            ShareNode(
                "a",
                1,
                (
                    ShareNode(
                        "b", 1, (ShareNode("c", 1, (ShareNode("alice", 1), ShareNode("bob", 1))),)
                    ),
                ),
            ),
            ShareNode("carol", 1),
        ),
    )
    factors = fairshare_factors(tree, {"alice": 10.0, "carol": 10.0})
    # alice and bob split a's half: bob is charged half of his sibling's usage.
    assert factors["alice"] == pytest.approx(0.25)
    assert factors["bob"] == pytest.approx(0.5)
    assert factors["carol"] == pytest.approx(0.5)


def test_it_halves_usage_every_half_life() -> None:
    records = [UsageRecord("alice", 0.0, 100.0), UsageRecord("alice", 100.0, 100.0, 2.0)]
    usage = decayed_usage(records, now=100.0, half_life_s=100.0)
    assert usage["alice"] == pytest.approx(50.0 + 200.0)

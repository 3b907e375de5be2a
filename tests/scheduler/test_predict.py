"""The runtime predictor: keys, fallbacks and the cap at the time limit."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from scheduler.predict import JobFeatures, RuntimePredictor, command_shape, command_shape_key


def test_it_treats_commands_that_differ_only_in_numbers_and_paths_as_one_shape() -> None:
    a = command_shape("python /home/alice/run1/train.py --lr 0.001 --seed 3")
    b = command_shape("python /data/exp7/train.py  --lr 3e-4 --seed 11")
    assert a == b


def test_its_shape_key_is_short_and_equal_exactly_for_equal_shapes() -> None:
    a = command_shape_key("python /home/alice/run1/train.py --lr 0.001")
    assert a == command_shape_key("python /data/exp7/train.py --lr 3e-4")
    assert a != command_shape_key("torchrun /data/exp7/train.py --lr 3e-4")
    assert len(command_shape_key("x" * 100_000)) == 32


# At one microsecond a step, the old pattern's quadratic scan of one megabyte of word
# characters is 10^12 / 2 steps: about six days. A linear scan is a few milliseconds.
MEGABYTE = 1_000_000


def test_it_shapes_a_megabyte_long_word_in_one_pass() -> None:
    assert command_shape("x" * MEGABYTE) == "x" * MEGABYTE


def test_it_shapes_a_megabyte_of_path_characters_and_hex_in_one_pass() -> None:
    assert command_shape("a." * (MEGABYTE // 2) + " /") == "a." * (MEGABYTE // 2) + " <path>"
    assert command_shape("ab" * (MEGABYTE // 2) + "g") == "ab" * (MEGABYTE // 2) + "g"
    assert command_shape("7" * MEGABYTE + "x") == "#x"


# The shape every stored job was keyed by (the old pattern): the new one must agree, or
# a member's history would stop matching their new jobs.
_OLD_PATH = re.compile(r"(?:[\w.-]*/)+[\w.-]*")
_OLD_HEX = re.compile(r"\b[0-9a-f]{8,}\b")


def _old_shape(command: str) -> str:
    shape = _OLD_PATH.sub("<path>", command.strip().lower())
    shape = _OLD_HEX.sub("<hex>", shape)
    shape = re.sub(r"\d+(?:\.\d+)?(?:e-?\d+)?", "#", shape)
    return re.sub(r"\s+", " ", shape)


@given(st.text(alphabet="ab7f9_.-/ =é\t", max_size=60))
def test_its_shapes_are_those_of_the_old_pattern(command: str) -> None:
    assert command_shape(command) == _old_shape(command)


def test_it_falls_back_to_the_time_limit_without_history() -> None:
    predictor = RuntimePredictor()
    assert predictor.predict(JobFeatures("alice", "img", "train", 1), 3600) == 3600


def test_it_predicts_the_median_of_the_same_users_same_command_shape() -> None:
    predictor = RuntimePredictor()
    for runtime in (100, 200, 900):
        shape = command_shape_key(f"train --seed {runtime}")
        predictor.observe(JobFeatures("alice", "img", shape, 1), runtime, 3600)
    shape = command_shape_key("train --seed 5")
    assert predictor.predict(JobFeatures("alice", "img", shape, 1), 3600) == 200


def test_it_falls_back_from_gpu_count_to_command_shape_to_image() -> None:
    predictor = RuntimePredictor()
    predictor.observe(JobFeatures("alice", "img", "train", 1), 100, 3600)
    assert predictor.predict(JobFeatures("alice", "img", "train", 4), 3600) == 100
    assert predictor.predict(JobFeatures("alice", "img", "eval", 1), 3600) == 100


def test_it_uses_the_users_share_of_the_limit_for_a_new_image() -> None:
    predictor = RuntimePredictor()
    predictor.observe(JobFeatures("alice", "img", "train", 1), 1800, 3600)
    assert predictor.predict(JobFeatures("alice", "other", "x", 1), 7200) == 3600
    assert predictor.predict(JobFeatures("bob", "img", "train", 1), 7200) == 7200


def test_it_never_predicts_more_than_the_time_limit() -> None:
    predictor = RuntimePredictor()
    predictor.observe(JobFeatures("alice", "img", "train", 1), 10_000, 20_000)
    assert predictor.predict(JobFeatures("alice", "img", "train", 1), 3600) == 3600

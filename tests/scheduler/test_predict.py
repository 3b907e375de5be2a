"""The runtime predictor: keys, fallbacks and the cap at the time limit."""

from __future__ import annotations

from scheduler.predict import JobFeatures, RuntimePredictor, command_shape


def test_it_treats_commands_that_differ_only_in_numbers_and_paths_as_one_shape() -> None:
    a = command_shape("python /home/alice/run1/train.py --lr 0.001 --seed 3")
    b = command_shape("python /data/exp7/train.py  --lr 3e-4 --seed 11")
    assert a == b


def test_it_falls_back_to_the_time_limit_without_history() -> None:
    predictor = RuntimePredictor()
    assert predictor.predict(JobFeatures("alice", "img", "train", 1), 3600) == 3600


def test_it_predicts_the_median_of_the_same_users_same_command_shape() -> None:
    predictor = RuntimePredictor()
    for runtime in (100, 200, 900):
        predictor.observe(JobFeatures("alice", "img", f"train --seed {runtime}", 1), runtime, 3600)
    assert predictor.predict(JobFeatures("alice", "img", "train --seed 5", 1), 3600) == 200


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

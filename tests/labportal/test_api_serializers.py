"""Serializer fields copied per use (core.api_serializers.copy_fields) behave as deep copies."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from rest_framework.renderers import JSONRenderer

from core import api_serializers
from jobqueue.serializers import JobSerializer, JobSubmitSerializer
from tests.jobqueue.test_submit import submit

pytestmark = pytest.mark.django_db


def test_each_use_gets_its_own_fields_bound_to_itself() -> None:
    first, second = JobSerializer(), JobSerializer()
    for name, field in first.fields.items():
        other = second.fields[name]
        assert field is not other
        assert field.parent is first and other.parent is second
    # Fields that hold fields hold their own copies, bound to the copy.
    for serializer in (first, second):
        mounts: Any = serializer.fields["mounts"]
        slurm: Any = serializer.fields["slurm"]
        assert mounts.child_relation.parent is mounts
        assert slurm.fields["state"].parent is slurm
    env_a: Any = JobSubmitSerializer().fields["env"]
    env_b: Any = JobSubmitSerializer().fields["env"]
    assert env_a.child is not env_b.child
    assert env_a.child.parent is env_a
    # The class's own (unbound) fields are never bound by a use.
    assert all(f.parent is None for f in JobSerializer._built_fields.values())  # type: ignore[attr-defined]


def test_a_submit_answer_and_refusals_are_what_deep_copies_give(
    alice: Any, cluster: Any, image: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = submit(alice, env={"A": "1"}, name="n")
    bad = {"image": "", "command": 3, "gpus": 0, "env": {"A": 1, "B": None}, "mounts": [None]}

    def outputs() -> tuple[bytes, Any, Any]:
        answer = JSONRenderer().render(JobSerializer(job).data)
        refusal = JobSubmitSerializer(data=bad)
        assert not refusal.is_valid()
        accepted = JobSubmitSerializer(data={"image": "x", "command": ["a"]})
        assert accepted.is_valid(), accepted.errors
        return answer, json.loads(json.dumps(refusal.errors)), dict(accepted.validated_data)

    cheap = outputs()
    monkeypatch.setattr(api_serializers, "copy_fields", copy.deepcopy)
    assert outputs() == cheap

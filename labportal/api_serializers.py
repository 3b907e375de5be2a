"""Serializer helpers shared by the apps' APIs."""

from __future__ import annotations

import copy
from typing import Any

from rest_framework import serializers


class CachedFieldsModelSerializer(serializers.ModelSerializer[Any]):
    # A ModelSerializer that inspects its model once per class, not once per use.
    # (A comment, not a docstring: the API schema would show a docstring as the
    # description of every serializer that has none of its own.)
    #
    # DRF's ModelSerializer rebuilds every field from the model's metadata (kwargs,
    # labels, validators) each time a serializer is used: about a third of the CPU of
    # a job submit's answer. The fields depend only on the class (Meta and declared
    # fields), so they are built once and each use gets its own copies, exactly as a
    # plain Serializer copies its declared fields.

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        cls = type(self)
        built = cls.__dict__.get("_built_fields")
        if built is None:
            built = super().get_fields()
            # A race builds the same fields twice; both results are equal.
            cls._built_fields = built  # type: ignore[attr-defined]
        return copy.deepcopy(built)

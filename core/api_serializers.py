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
    # plain Serializer copies its declared fields (copy_fields: cheaper, same result).

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        cls = type(self)
        built = cls.__dict__.get("_built_fields")
        if built is None:
            built = {**super().get_fields(), **self.extra_fields()}
            # A race builds the same fields twice; both results are equal.
            cls._built_fields = built  # type: ignore[attr-defined]
        return copy_fields(built)

    def extra_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        # Fields a subclass adds to (or puts in place of) the model's, built with them once.
        return {}


class CheapCopySerializer(serializers.Serializer[Any]):
    # A plain Serializer whose declared fields are copied for each use with
    # copy_fields rather than copy.deepcopy (a comment, not a docstring: see above).

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        return copy_fields(self._declared_fields)


def copy_fields(
    fields: dict[str, serializers.Field[Any, Any, Any, Any]],
) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
    """Each use's own copies of a serializer's unbound fields, as copy.deepcopy gives.

    DRF deep-copies a field by constructing it again from its arguments: a third of
    the CPU of building a serializer's fields. An unbound plain field keeps nothing
    that a use changes (bind() sets attributes of the copy; DRF itself shares the
    validators and regexes between copies), so a shallow copy is the same. A field
    that holds other fields (a nested serializer, a list or dict field's child, a
    many-related field's child relation) binds them to itself: those are deep-copied.
    """
    copies: dict[str, serializers.Field[Any, Any, Any, Any]] = {}
    for name, field in fields.items():
        if isinstance(field, _HOLDERS) or hasattr(field, "child") or getattr(field, "parent", None):
            copies[name] = copy.deepcopy(field)
        else:
            copies[name] = copy.copy(field)
    return copies


_HOLDERS = (serializers.BaseSerializer, serializers.ManyRelatedField)

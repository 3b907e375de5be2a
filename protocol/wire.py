"""Decoding a received message into its Struct (`protocol.messages`), or saying why not.

`decode` is msgspec's strict conversion; when it fails, `Refused.detail` is the refusal
the failing field declares (its `extra["refused"]`, see `protocol.messages`), so the
reasons an admin or a member reads stay the same whichever side decodes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import inspect

from protocol.messages import GPUS, GpuReport, Message, NodeInfo

M = TypeVar("M", bound=Message)

_AT = re.compile(r" - at (`key` in )?`(\$[^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `([^`]+)`$")
_TYPE_ERROR = re.compile(r"^Expected `[^`]*`, got `")
_SEGMENT = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
# msgspec's own texts; anything else is a refusal a Struct's __post_init__ raised.
_MSGSPEC_TEXTS = ("Expected ", "Invalid enum value", "Object missing required field")


class Refused(ValueError):
    """A received message (or a part of it) that does not fit its definition."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def decode(cls: type[M], data: object) -> M:
    """`data` (a decoded JSON object) as a `cls`; raise `Refused` saying what is wrong."""
    if not isinstance(data, Mapping):
        raise Refused(cls.object_refused.format(type=type(data).__name__))
    data = dict(data)
    if cls.empty_is_default:
        optional = _optional_fields(cls)
        data = {key: value for key, value in data.items() if value or key not in optional}
    try:
        return msgspec.convert(data, cls, strict=True)
    except msgspec.ValidationError as exc:
        raise Refused(explain(cls, data, str(exc))) from None


# `gpus` with each entry left as sent, so that one bad GPU does not refuse the others.
class _NodeInfoEntries(NodeInfo, frozen=True, kw_only=True):
    gpus: Annotated[list[Any], GPUS]


def node_info_decode(info: object) -> tuple[NodeInfo, list[str]]:
    """`node_register`'s info, with the GPUs that fit; each other entry, as a refusal detail."""
    entries = decode(_NodeInfoEntries, info)
    gpus: list[GpuReport] = []
    bad: list[str] = []
    seen: set[str] = set()
    for position, raw in enumerate(entries.gpus):
        try:
            gpu = decode(GpuReport, raw)
        except Refused as exc:
            bad.append(f"gpus[{position}]: {exc.detail}")
            continue
        if gpu.uuid in seen:
            bad.append(f"gpus[{position}]: UUID {gpu.uuid} reported twice")
            continue
        seen.add(gpu.uuid)
        gpus.append(gpu)
    fields = {name: getattr(entries, name) for name in NodeInfo.__struct_fields__}
    return NodeInfo(**{**fields, "gpus": gpus}), bad


def explain(cls: type[Message], data: dict[str, Any], error: str) -> str:
    """The refusal detail for msgspec's `error` about `data` as a `cls`."""
    at = _AT.search(error)
    text, path = (error[: at.start()], at.group(2)) if at else (error, "$")
    if not text.startswith(_MSGSPEC_TEXTS):
        return text
    # (a field's name, "") or ("", an entry's index or "...")
    segments: list[tuple[str, str]] = _SEGMENT.findall(path[1:])
    missing = _MISSING.match(text)
    if missing:
        segments.append((missing.group(1), ""))
    info: Any = inspect.type_info(cls)
    owner: Any = cls
    field: inspect.Field | None = None
    cursor: Any = data
    parent: dict[str, Any] = data
    value: Any = None
    item = bool(at and at.group(1))
    for segment, index in segments:
        info = _unwrap(info)
        if segment and isinstance(info, inspect.StructType):
            field = next((f for f in info.fields if f.encode_name == segment), None)
            if field is None:
                return text
            owner = info.cls
            parent = cursor if isinstance(cursor, dict) else {}
            cursor = value = parent.get(segment)
            info, item = field.type, False
        else:
            item = True
            info = getattr(info, "item_type", None) or getattr(info, "value_type", None)
            cursor = _entry(cursor, index)
    if field is None:
        return text
    key = field.encode_name
    if missing and owner.missing:
        return owner.missing.format(key=key)
    entry = _unwrap(info)
    if item and isinstance(entry, inspect.StructType) and at and not missing:
        refused: str = getattr(entry.cls, "object_refused", text)
        return refused.format(type=type(cursor).__name__)
    base, extra, _description = unwrap(field.type)
    if "text" in extra:
        return text_refusal(key, value, getattr(base, "max_length", None), extra["text"])
    if item and "refused_item" in extra:
        template = extra["refused_item"]
    elif _TYPE_ERROR.match(text) and "refused_type" in extra:
        template = extra["refused_type"]
    else:
        template = extra.get("refused", "{key}: " + text.replace("{", "{{").replace("}", "}}"))
    try:
        return str(template.format(key=key, value=value, parent=parent))
    except (KeyError, IndexError, ValueError):
        return f"{key}: {text}"


def text_refusal(key: str, value: Any, max_length: int | None, kind: str) -> str:
    """Why `value` is not a text of this `kind` ("identifier", "free" or "blank_ok")."""
    if not isinstance(value, str) or (kind != "blank_ok" and not value.strip()):
        return f"{key} must be a non-empty string, got {value!r:.80}"
    if max_length is not None and len(value) > max_length:
        return f"{key} is longer than {max_length} characters"
    if kind == "identifier":
        return f"{key} contains control characters: {value!r:.80}"
    return f"{key} is not valid"


def _entry(cursor: Any, index: str) -> Any:
    if isinstance(cursor, list) and index.isdigit() and int(index) < len(cursor):
        return cursor[int(index)]
    return None


def unwrap(info: Any) -> tuple[Any, dict[str, Any], str]:
    """A field's type (msgspec.inspect) under its metadata and `| None`, with its own
    `extra` and description (not its entries')."""
    extra: dict[str, Any] = {}
    description = ""
    while True:
        if isinstance(info, inspect.Metadata):
            extra = {**(info.extra or {}), **extra}
            description = description or (info.extra_json_schema or {}).get("description", "")
            info = info.type
        elif isinstance(info, inspect.UnionType):
            members = [t for t in info.types if not isinstance(t, inspect.NoneType)]
            info = members[0] if members else info.types[0]
        else:
            return info, extra, description


def _unwrap(info: Any) -> Any:
    return unwrap(info)[0]


@functools.cache
def _optional_fields(cls: type[Message]) -> list[str]:
    info = inspect.type_info(cls)
    assert isinstance(info, inspect.StructType)
    return [f.encode_name for f in info.fields if not f.required]

"""docs/agent.md's message tables, generated from `protocol.messages`.

Each table sits between `<!-- generated: protocol.messages.NAME -->` and
`<!-- end generated -->`; `render` rewrites them from the Structs, and a test checks
that the file equals its rendering, so the docs cannot drift from the wire.

    python -m protocol.docs docs/agent.md          # rewrite the tables
    python -m protocol.docs --check docs/agent.md  # exit 1 if they are out of date
"""

from __future__ import annotations

import re
import sys
import typing
from typing import Any

import msgspec
from msgspec import inspect

from protocol import messages, wire

GENERATED = re.compile(
    r"(<!-- generated: protocol\.messages\.(\w+) -->\n).*?(<!-- end generated -->)", re.S
)


def table(cls: type[messages.Message]) -> str:
    """A markdown table of `cls`'s fields: name, type, notes (limits, defaults, description)."""
    info = inspect.type_info(cls)
    assert isinstance(info, inspect.StructType)
    rows = ["| field | type | notes |", "| --- | --- | --- |"]
    for field in info.fields:
        hints = typing.get_type_hints(cls, include_extras=True)
        notes = [*_constraints(field.type), wire.unwrap(field.type)[2]]
        if not field.required:
            notes.append(f"optional, default `{_default(field)}`")
        rows.append(
            f"| `{field.encode_name}` | {_declared_literal(hints[field.name]) or _type_name(field.type)} | "
            + "; ".join(n for n in notes if n).replace("|", "\\|")
            + " |"
        )
    return "\n".join(rows) + "\n"


def render(text: str) -> str:
    """`text` with each generated table rewritten from its Struct."""

    def replace(match: re.Match[str]) -> str:
        cls = getattr(messages, match.group(2))
        return match.group(1) + table(cls) + match.group(3)

    return GENERATED.sub(replace, text)


def _declared_literal(hint: Any) -> str:
    """A Literal field's values in the order they are declared (msgspec sorts them)."""
    if typing.get_origin(hint) is typing.Literal:
        return " \\| ".join(f'`"{v}"`' for v in typing.get_args(hint))
    for arg in typing.get_args(hint):
        if not isinstance(arg, type | typing.TypeVar) or typing.get_origin(arg):
            found = _declared_literal(arg)
            if found:
                return found
    return ""


def _type_name(info: Any) -> str:
    if isinstance(info, inspect.Metadata):
        doc_type = (info.extra or {}).get("doc_type")
        return str(doc_type) if doc_type else _type_name(info.type)
    if isinstance(info, inspect.UnionType):
        return " or ".join(_type_name(t) for t in info.types)
    if isinstance(info, inspect.NoneType):
        return "null"
    if isinstance(info, inspect.LiteralType):
        return " \\| ".join(f'`"{v}"`' for v in info.values)
    if isinstance(info, inspect.ListType):
        return f"list[{_type_name(info.item_type)}]"
    if isinstance(info, inspect.DictType):
        key = _type_name(info.key_type)
        return f"dict[{key}, {_type_name(info.value_type)}]"
    if isinstance(info, inspect.StructType):
        return "{" + ", ".join(f"`{f.encode_name}`" for f in info.fields) + "}"
    names: dict[type, str] = {
        inspect.IntType: "int",
        inspect.FloatType: "float",
        inspect.StrType: "str",
        inspect.BoolType: "bool",
        inspect.AnyType: "any",
    }
    return names.get(type(info), type(info).__name__)


def _constraints(info: Any) -> list[str]:
    bare, extra, _description = wire.unwrap(info)
    out = []
    if isinstance(bare, inspect.StrType):
        if bare.min_length:
            out.append("non-empty")
        if bare.max_length is not None:
            out.append(f"at most {bare.max_length} characters")
        if extra.get("text") == "identifier":
            out.append("no control characters")
    if isinstance(bare, inspect.ListType) and bare.max_length is not None:
        out.append(f"at most {bare.max_length} entries")
    if isinstance(bare, inspect.IntType | inspect.FloatType):
        low = f"≥ {_number(bare.ge)}" if bare.ge is not None else None
        low = f"> {_number(bare.gt)}" if bare.gt is not None else low
        high = f"≤ {_number(bare.le)}" if bare.le is not None else None
        out.append(", ".join(part for part in (low, high) if part))
    return [c for c in out if c]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _default(field: inspect.Field) -> str:
    default = field.default_factory() if field.default is msgspec.NODEFAULT else field.default
    return msgspec.json.encode(default).decode()


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [a for a in argv if a != "--check"] or ["docs/agent.md"]
    stale = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        rendered = render(text)
        if rendered != text:
            stale.append(path)
            if not check:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(rendered)
    if check and stale:
        print(f"out of date (python -m protocol.docs {' '.join(stale)}): {', '.join(stale)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

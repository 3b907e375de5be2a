"""The import graph of LabPortal's packages, read with ``ast`` (nothing is imported).

``python -m tests.architecture.importgraph`` prints the circles, the imports that go up
a layer, and the largest files, and exits 1 while any rule is broken; ``tests/architecture/test_layers.py`` holds the rules.
Every import counts, also one inside a function or under ``TYPE_CHECKING``: a lazy
import is still a dependency, it only fails later.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The layers of ../shared/DESIGN.md, "Layout and layers", from the ground up. A package
# may import its own layer or below; nothing below imports anything above.
LAYERS: dict[str, int] = {
    "core": 0,
    "scheduler": 0,
    "protocol": 0,
    "accounts": 1,
    "notifications": 1,
    "cluster": 2,
    "jobqueue": 3,
    "credits": 4,
    "approvals": 4,
    "reservations": 4,
    "telemetry": 4,
    "files": 4,
    "joblogs": 4,
    "scheduling": 5,
    "slurm": 5,
    "sessions": 5,
    "reports": 6,
    "alerts": 6,
    "handbook": 6,
    "ops": 6,
    "labportal": 7,
}

# Apart from the installed portal: what each may import of the product. Nothing in the
# product imports them.
APART: dict[str, frozenset[str]] = {
    "agent": frozenset({"agent", "protocol", "core"}),
    "labctl": frozenset({"labctl"}),
    "benchmarks": frozenset(LAYERS) | {"benchmarks", "demo", "agent", "labctl"},
    "demo": frozenset(LAYERS) | {"demo", "agent"},
    # Deployment scripts (locks, image build steps, health checks): the standard library only.
    "deploy": frozenset({"deploy"}),
}

PACKAGES = frozenset(LAYERS) | frozenset(APART)
SKIP_PARTS = {"migrations", "__pycache__"}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted
    target: str  # the imported module, dotted (resolved to a module file where one exists)
    line: int

    @property
    def source_package(self) -> str:
        return self.source.split(".")[0]

    @property
    def target_package(self) -> str:
        return self.target.split(".")[0]


@dataclass
class Graph:
    modules: dict[str, Path] = field(default_factory=dict)
    imports: list[Import] = field(default_factory=list)

    def edges(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {m: set() for m in self.modules}
        for imp in self.imports:
            if imp.target in self.modules and imp.target != imp.source:
                out[imp.source].add(imp.target)
        return out


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse``, once more if CPython 3.11's AST converter trips on another thread.

    On 3.11 the converter's recursion counter is shared between threads (CPython
    gh-106905, fixed in 3.12): while a background thread of an earlier test formats a
    traceback (which parses the failing line), a parse here can fail with "AST
    constructor recursion depth mismatch". The source is not at fault, so try again.
    """
    for attempt in range(5):
        try:
            return ast.parse(source, filename=filename)
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc) or attempt == 4:
                raise
    raise AssertionError("unreachable")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _iter_files(packages: frozenset[str]) -> Iterator[Path]:
    for package in sorted(packages):
        base = ROOT / package
        if not (base / "__init__.py").exists():
            continue
        for path in sorted(base.rglob("*.py")):
            if SKIP_PARTS.isdisjoint(path.relative_to(ROOT).parts):
                yield path


def _resolve(name: str, modules: dict[str, Path]) -> str:
    """The longest prefix of ``name`` that is one of our modules (``a.b.func`` → ``a.b``)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return name


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, int]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                drop = node.level - (1 if is_package else 0)
                base = base[: len(base) - drop] if drop else base
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for alias in node.names:
                yield f"{prefix}.{alias.name}", node.lineno
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value, node.lineno


def build(packages: frozenset[str] = PACKAGES) -> Graph:
    graph = Graph()
    for path in _iter_files(packages):
        graph.modules[_module_name(path)] = path
    for module, path in list(graph.modules.items()):
        tree = parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, line in _imported_names(tree, module, path.name == "__init__.py"):
            if name.split(".")[0] not in PACKAGES:
                continue
            target = _resolve(name, graph.modules)
            graph.imports.append(Import(module, target, line))
    return graph


def circles(graph: Graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    edges = graph.edges()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found, key=lambda c: (-len(c), c))


def cross_package_circles(graph: Graph) -> list[list[str]]:
    return [c for c in circles(graph) if len({m.split(".")[0] for m in c}) > 1]


def forbidden_imports(graph: Graph) -> list[Import]:
    """Imports that go up a layer, out of an apart package's allowance, or into one."""
    bad: list[Import] = []
    for imp in dict.fromkeys(graph.imports):
        src, dst = imp.source_package, imp.target_package
        if src == dst:
            continue
        if src in APART:
            if dst not in APART[src]:
                bad.append(imp)
        elif dst in APART or LAYERS[dst] > LAYERS[src]:
            bad.append(imp)
    return bad


def largest_files(graph: Graph, count: int = 10) -> list[tuple[int, str]]:
    sizes = [
        (len(path.read_text(encoding="utf-8").splitlines()), str(path.relative_to(ROOT)))
        for path in graph.modules.values()
    ]
    return sorted(sizes, reverse=True)[:count]


def main() -> int:
    graph = build()
    all_circles = circles(graph)
    crossing = cross_package_circles(graph)
    bad = forbidden_imports(graph)
    print(f"modules: {len(graph.modules)}, imports between our modules: {len(graph.imports)}")
    print(f"import circles: {len(all_circles)} ({len(crossing)} crossing packages)")
    for circle in all_circles:
        print(f"  {len(circle):3d}  {' '.join(circle)}")
    pairs = sorted({(i.source, i.target) for i in bad})
    print(f"forbidden imports: {len(bad)} ({len(pairs)} module pairs)")
    for src, dst in pairs:
        print(f"  {src} -> {dst}")
    print("largest files:")
    for lines, path in largest_files(graph):
        print(f"  {lines:6d}  {path}")
    return 1 if crossing or bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""The layers of ../shared/DESIGN.md hold: imports go to the same layer or below, and no
import circle crosses packages. The graph is read with ``ast`` from the source tree."""

from __future__ import annotations

import ast

import pytest

from tests.architecture import importgraph


@pytest.fixture(scope="module")
def graph() -> importgraph.Graph:
    return importgraph.build()


def test_every_top_level_package_has_a_place(graph: importgraph.Graph) -> None:
    found = {
        path.parent.name
        for path in importgraph.ROOT.glob("*/__init__.py")
        if path.parent.name not in {"tests"}
    }
    unplaced = found - importgraph.PACKAGES
    assert not unplaced, f"packages with no layer in tests/architecture/importgraph.py: {unplaced}"


def test_no_import_circle_crosses_packages(graph: importgraph.Graph) -> None:
    crossing = importgraph.cross_package_circles(graph)
    assert not crossing, "import circles across packages:\n" + "\n".join(
        " ".join(circle) for circle in crossing
    )


def test_imports_go_to_the_same_layer_or_below(graph: importgraph.Graph) -> None:
    bad = importgraph.forbidden_imports(graph)
    assert not bad, "imports that go up a layer or into a package apart:\n" + "\n".join(
        f"{graph.modules[i.source].relative_to(importgraph.ROOT)}"
        f":{i.line}: {i.source} -> {i.target}"
        for i in bad
    )


@pytest.mark.parametrize("package", ["protocol", "agent", "scheduler", "labctl"])
def test_django_free_packages_import_no_django(graph: importgraph.Graph, package: str) -> None:
    offenders = []
    for module, path in graph.modules.items():
        if module.split(".")[0] != package:
            continue
        for node in ast.walk(importgraph.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            offenders += [
                f"{module}:{node.lineno} {n}"
                for n in names
                if n.split(".")[0] in {"django", "rest_framework"}
            ]
    assert not offenders, f"{package} must run without Django: {offenders}"


def test_the_checker_sees_an_upward_import_and_a_circle() -> None:
    """The rules themselves: a made-up graph with one of each is caught."""
    fake = importgraph.Graph(
        modules={"cluster.a": importgraph.ROOT, "jobqueue.b": importgraph.ROOT},
        imports=[
            importgraph.Import("cluster.a", "jobqueue.b", 1),
            importgraph.Import("jobqueue.b", "cluster.a", 1),
        ],
    )
    assert [(i.source, i.target) for i in importgraph.forbidden_imports(fake)] == [
        ("cluster.a", "jobqueue.b")
    ]
    assert importgraph.cross_package_circles(fake) == [["cluster.a", "jobqueue.b"]]

"""The three distributions: the portal (pyproject.toml), the node agent
(distributions/agent) and labctl (distributions/labctl). Each ships its own packages from
the repository root and declares every library its code imports; a library two of them
share has the same pins in both; the agent's installers take its dependencies from its
pyproject.toml instead of repeating them."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from django.conf import settings
from packaging.requirements import Requirement
from setuptools import find_packages

from tests.architecture import importgraph

ROOT = Path(__file__).resolve().parents[2]
PORTAL = ROOT / "pyproject.toml"
AGENT = ROOT / "distributions" / "agent" / "pyproject.toml"
LABCTL = ROOT / "distributions" / "labctl" / "pyproject.toml"

# What an import name is installed as, where the two differ.
DISTRIBUTION_OF = {"pynvml": "nvidia-ml-py"}
# Imported, and installed by a declared dependency (vine comes with kombu and celery).
TRANSITIVE = {"vine"}


def _toml(path: Path) -> dict:
    return tomllib.loads(path.read_text())


def _requirements(path: Path) -> dict[str, Requirement]:
    project = _toml(path)["project"]
    found = [Requirement(line) for line in project["dependencies"]]
    for extra in project.get("optional-dependencies", {}).values():
        found += [Requirement(line) for line in extra]
    return {r.name.lower(): r for r in found}


def _shipped(path: Path) -> dict[str, str]:
    """The wheel's top-level packages: where each comes from, relative to the repo root."""
    wheel = _toml(path)["tool"]["hatch"]["build"]["targets"]["wheel"]
    include = wheel["hooks"]["custom"]["packages"]  # taken in by distributions/hatch_build.py
    return {
        target: str((path.parent / source).resolve().relative_to(ROOT))
        for source, target in include.items()
    }


def _third_party_imports(packages: list[str]) -> set[str]:
    names: set[str] = set()
    for package in packages:
        for file in (ROOT / package).rglob("*.py"):
            for node in ast.walk(importgraph.parse(file.read_text())):
                if isinstance(node, ast.Import):
                    names |= {alias.name.partition(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names.add(node.module.partition(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in packages}


@pytest.mark.parametrize(
    ("pyproject", "packages", "script"),
    [(AGENT, ["agent", "protocol"], "labportal-agent"), (LABCTL, ["labctl"], "labctl")],
)
def test_a_distribution_ships_its_packages_and_declares_what_they_import(
    pyproject: Path, packages: list[str], script: str
) -> None:
    assert _shipped(pyproject) == {p: p for p in packages}
    declared = set(_requirements(pyproject))
    needed = {DISTRIBUTION_OF.get(n, n).lower() for n in _third_party_imports(packages)}
    assert needed - TRANSITIVE <= declared, f"imported, not declared: {needed - declared}"
    assert "django" not in declared
    assert script in _toml(pyproject)["project"]["scripts"]


def test_the_portal_leaves_the_agent_and_labctl_to_their_distributions() -> None:
    portal = _toml(PORTAL)
    include = portal["tool"]["setuptools"]["packages"]["find"]["include"]
    assert not {p for p in include if p.startswith(("agent", "labctl"))}
    assert not set(portal["project"].get("scripts", {})) & {"labportal-agent", "labctl"}
    # The portal's code imports protocol/ (tests/architecture/importgraph.py), so it ships it.
    assert "protocol*" in include


@pytest.mark.parametrize("pyproject", [AGENT, LABCTL])
def test_a_library_the_portal_shares_has_the_same_pins(pyproject: Path) -> None:
    portal = _requirements(PORTAL)
    for name, requirement in _requirements(pyproject).items():
        if name in portal:
            assert requirement.specifier == portal[name].specifier, name


@pytest.mark.parametrize("installer", ["Dockerfile.agent", "deploy/agent/install.sh"])
def test_the_agent_installers_name_no_dependency_of_their_own(installer: str) -> None:
    text = (ROOT / installer).read_text()
    assert "distributions/agent" in text
    for name in _requirements(AGENT):
        assert not re.search(rf"[\"' ]{re.escape(name)}[<>=]", text, re.IGNORECASE), name


def _compile_packages() -> ModuleType:
    path = ROOT / "deploy" / "docker" / "compile_packages.py"
    spec = importlib.util.spec_from_file_location("compile_packages", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_portal_image_byte_compiles_every_package_the_portal_ships() -> None:
    include = _toml(PORTAL)["tool"]["setuptools"]["packages"]["find"]["include"]
    shipped = {name.partition(".")[0] for name in find_packages(str(ROOT), include=include)}
    compiled = set(_compile_packages().packages(ROOT))
    assert compiled == shipped
    # Every local app of the settings, and protocol/, which the portal imports.
    assert {app for app in settings.LOCAL_APPS if app != "demo"} | {"core", "protocol"} <= compiled
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "deploy/docker/compile_packages.py" in dockerfile
    assert "compileall" not in dockerfile  # no list of its own to fall behind

"""The locks under requirements/ (deploy/lockfile.py): current with the pyproject.toml
files, and `make lock-check` fails once a dependency changes without them."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
COPIED = [
    "Makefile",
    "pyproject.toml",
    "distributions/agent/pyproject.toml",
    "distributions/labctl/pyproject.toml",
    "deploy/lockfile.py",
    "requirements",
]


def _lockfile() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lockfile", ROOT / "deploy" / "lockfile.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


lockfile = _lockfile()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The files `make lock-check` reads, copied so a test can make them stale."""
    for name in COPIED:
        source, target = ROOT / name, tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy2(source, target)
    return tmp_path


def _make_lock_check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "lock-check", f"PYTHON={sys.executable}"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_the_committed_locks_are_current() -> None:
    assert lockfile.check(ROOT) == []


def test_make_lock_check_passes_on_the_committed_locks(checkout: Path) -> None:
    result = _make_lock_check(checkout)
    assert result.returncode == 0, result.stderr
    assert "are current" in result.stdout


def test_make_lock_check_fails_when_a_dependency_is_added_without_the_lock(
    checkout: Path,
) -> None:
    _edit(
        checkout / "pyproject.toml",
        '  "Django>=5.2,<5.3",\n',
        '  "Django>=5.2,<5.3",\n  "tablib>=3",\n',
    )
    result = _make_lock_check(checkout)
    assert result.returncode != 0
    assert "requirements/dev.txt is stale" in result.stderr
    assert "requirements/portal.txt is stale" in result.stderr
    assert "requirements/dev.txt does not pin tablib" in result.stderr
    # The agent's lock is made from its own pyproject.toml only.
    assert "requirements/agent.txt" not in result.stderr


def test_make_lock_check_fails_when_a_range_changes_without_the_lock(checkout: Path) -> None:
    # A wider range the old pin still satisfies: only the recorded inputs show the change.
    _edit(checkout / "distributions/agent/pyproject.toml", '"docker>=7.1,<8"', '"docker>=7.1,<9"')
    result = _make_lock_check(checkout)
    assert result.returncode != 0
    assert "requirements/agent.txt is stale" in result.stderr
    assert "requirements/dev.txt is stale" in result.stderr


def test_an_extra_the_lock_is_made_from_counts_and_one_it_is_not_does_not(
    checkout: Path,
) -> None:
    pyproject = checkout / "pyproject.toml"
    _edit(pyproject, '  "pytest>=8.4,<9",\n', '  "pytest>=8.4,<9",\n  "tablib>=3",\n')
    stale = {p.split(" is stale")[0] for p in lockfile.check(checkout) if "is stale" in p}
    # The dev extra is in the development lock and its install without LDAP, not in the
    # portal's (nor in uv's, which holds uv alone, nor in LDAP's).
    assert stale == {"requirements/dev.txt", "requirements/dev-base.txt"}


def test_a_pin_outside_its_range_fails(checkout: Path) -> None:
    lock = checkout / "requirements" / "agent.txt"
    version = re.search(r"^docker==(\S+)", lock.read_text(), re.M)
    assert version
    _edit(lock, f"docker=={version[1]}", "docker==6.1.3")
    problems = lockfile.check(checkout)
    assert any("agent.txt pins docker 6.1.3, outside docker<8,>=7.1" in p for p in problems)
    # The image would run a version the tests did not.
    assert any(
        "agent.txt pins docker 6.1.3, which requirements/dev.txt does not" in p for p in problems
    )


def test_a_pin_without_a_hash_fails(checkout: Path) -> None:
    lock = checkout / "requirements" / "dev.txt"
    lines = lock.read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("docker=="))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("    --hash"))
    lines[start] = lines[start].replace(" \\", "")
    del lines[start + 1 : end]
    lock.write_text("".join(lines))
    assert "requirements/dev.txt: docker is pinned without a hash" in lockfile.check(checkout)


@pytest.mark.parametrize(
    ("installer", "lock"),
    [
        ("Makefile", "requirements/dev-base.txt"),
        ("Makefile", "requirements/ldap.txt"),
        ("Dockerfile", "requirements/portal.txt"),
        ("Dockerfile.agent", "requirements/agent.txt"),
    ],
)
def test_the_installers_install_from_the_lock_with_hashes(installer: str, lock: str) -> None:
    text = (ROOT / installer).read_text()
    assert lock in text
    assert "--require-hashes" in text
    # Local distributions only without dependencies: everything else comes from the lock.
    for line in re.findall(r"(?:pip|uv pip) install[^\n]*", text):
        assert "--require-hashes" in line or "--no-deps" in line, line


@pytest.mark.parametrize(
    ("installer", "lock"),
    [
        ("Dockerfile", "portal.txt"),
        ("Dockerfile.agent", "agent.txt"),
        ("deploy/agent/install.sh", "requirements/agent.txt"),
    ],
)
def test_plain_pip_installs_a_lock_as_its_whole_closure(installer: str, lock: str) -> None:
    # An image's pip is the base image's (Debian bookworm's pip 23): resolving a lock's
    # dependencies, it refuses one asked for with an extra (weasyprint's fonttools[woff]) as
    # "not pinned with ==". The lock already is the closure: install it as it stands, then
    # let pip check that nothing is missing.
    text = (ROOT / installer).read_text()
    (line,) = [ln for ln in re.findall(r"pip\"? install[^\n]*", text) if lock in ln]
    assert "--require-hashes" in line and "--no-deps" in line, line
    assert re.search(r"pip\"? check", text[text.index(line) :]), (
        f"{installer}: no pip check after {line}"
    )

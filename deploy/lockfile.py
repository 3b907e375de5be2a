"""The hash-pinned lock files under requirements/, made with uv from the pyproject.toml files.

    python3 deploy/lockfile.py compile [--upgrade]   # `make lock`: resolve with uv, write the locks
    python3 deploy/lockfile.py check                  # `make lock-check`: fail on a stale lock

Each lock records a digest of the requirements it was resolved from (its dependencies and
extras in the pyproject.toml files). `check` needs no network and no uv: a lock is stale
when that digest no longer matches, when a pin falls outside its pyproject range, when a
pin has no hash, or when the portal's or the agent's lock pins a version the development
lock does not (the images run what the tests ran). `compile` keeps the pins already in a
lock (uv reads them as preferences) unless given --upgrade.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version
except ImportError:  # a bare python3 in CI, before the venv exists: pip vendors packaging
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[assignment]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[assignment]
    from pip._vendor.packaging.version import Version  # type: ignore[assignment]

PYTHON_VERSION = "3.11"
DIGEST_PREFIX = "# labportal lock inputs sha256: "
AGENT = "distributions/agent/pyproject.toml"
LABCTL = "distributions/labctl/pyproject.toml"


@dataclass(frozen=True)
class Lock:
    path: str
    sources: tuple[str, ...]  # pyproject.toml files, their [project] dependencies
    extras: tuple[str, ...] = ()  # of the root pyproject.toml
    constraint: str | None = None  # another lock: the same versions, a subset of them
    only: tuple[str, ...] = ()  # just these of the requirements
    what: str = field(default="", compare=False)


# The development lock first: the others are resolved within it.
LOCKS = (
    Lock(
        "requirements/dev.txt",
        ("pyproject.toml", AGENT, LABCTL),
        ("dev", "reports", "ldap"),
        what="the whole development resolution: the portal with its dev, reports and ldap extras, the agent, labctl",
    ),
    # python-ldap has no wheel: it builds from source with a C compiler, libldap2-dev and
    # libsasl2-dev. `make install` syncs dev-base.txt (everything but LDAP) and adds ldap.txt
    # where those exist (.ci/run installs them), so a newcomer's machine without them still
    # installs and runs everything else.
    Lock(
        "requirements/dev-base.txt",
        ("pyproject.toml", AGENT, LABCTL),
        ("dev", "reports"),
        "requirements/dev.txt",
        what="make install, .ci/run: the development lock without the ldap extra",
    ),
    Lock(
        "requirements/ldap.txt",
        ("pyproject.toml",),
        ("ldap",),
        "requirements/dev.txt",
        only=("django-auth-ldap",),
        what="make install, where python-ldap can be built: campus sign-in's LDAP libraries",
    ),
    Lock(
        "requirements/portal.txt",
        ("pyproject.toml",),
        ("reports", "ldap"),
        "requirements/dev.txt",
        what="Dockerfile: the portal with its reports and ldap extras",
    ),
    Lock("requirements/agent.txt", (AGENT,), (), "requirements/dev.txt", what="Dockerfile.agent"),
    # `make install` installs uv with pip, hash-checked, then the rest with uv.
    Lock(
        "requirements/uv.txt",
        ("pyproject.toml",),
        ("dev",),
        "requirements/dev.txt",
        only=("uv",),
        what="make install: uv itself",
    ),
)


class StaleLock(Exception):
    pass


def requirements(root: Path, lock: Lock) -> list[Requirement]:
    """What `lock` is resolved from, as the pyproject.toml files declare it."""
    found: list[Requirement] = []
    for source in lock.sources:
        project = tomllib.loads((root / source).read_text())["project"]
        lines = list(project["dependencies"])
        extras = project.get("optional-dependencies", {})
        lines += [line for extra in lock.extras if extra in extras for line in extras[extra]]
        found += [Requirement(line) for line in lines]
    if lock.only:
        found = [r for r in found if canonicalize_name(r.name) in lock.only]
    return found


def inputs_digest(root: Path, lock: Lock) -> str:
    """Changes with any requirement or extra the lock is made from, not with their layout."""
    reqs = sorted(str(r) for r in requirements(root, lock))
    payload = {"python": PYTHON_VERSION, "extras": lock.extras, "requirements": reqs}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")


def pins(text: str) -> dict[str, list[tuple[str, int]]]:
    """Each pinned distribution's versions (a universal lock may pin one per Python), with
    the number of hashes each has."""
    found: dict[str, list[tuple[str, int]]] = {}
    current: list[tuple[str, int]] | None = None
    for line in text.splitlines():
        match = PIN.match(line)
        if match:
            current = found.setdefault(canonicalize_name(match[1]), [])
            current.append((match[2], 0))
        elif current is not None and line.strip().startswith("--hash="):
            version, hashes = current[-1]
            current[-1] = (version, hashes + 1)
    return found


def check(root: Path) -> list[str]:
    """Why each lock under root is stale; empty when all are current."""
    problems: list[str] = []
    for lock in LOCKS:
        path = root / lock.path
        if not path.exists():
            problems.append(f"{lock.path} is missing: run `make lock`")
            continue
        text = path.read_text()
        recorded = next(
            (
                line[len(DIGEST_PREFIX) :]
                for line in text.splitlines()
                if line.startswith(DIGEST_PREFIX)
            ),
            None,
        )
        if recorded != inputs_digest(root, lock):
            sources = ", ".join(lock.sources)
            problems.append(
                f"{lock.path} is stale: the dependencies in {sources} changed since it was "
                "made; run `make lock` and commit the result"
            )
        pinned = pins(text)
        for name, versions in pinned.items():
            if any(hashes == 0 for _, hashes in versions):
                problems.append(f"{lock.path}: {name} is pinned without a hash")
        for requirement in requirements(root, lock):
            name = canonicalize_name(requirement.name)
            releases = [Version(v) for v, _ in pinned.get(name, [])]
            if not releases:
                problems.append(f"{lock.path} does not pin {name} ({requirement})")
            elif not any(requirement.specifier.contains(v, prereleases=True) for v in releases):
                shown = ", ".join(map(str, releases))
                problems.append(f"{lock.path} pins {name} {shown}, outside {requirement}")
        if lock.constraint and (root / lock.constraint).exists():
            within = pins((root / lock.constraint).read_text())
            for name, versions in pinned.items():
                other = {v for v, _ in within.get(name, [])}
                for version, _ in versions:
                    if version not in other:
                        problems.append(
                            f"{lock.path} pins {name} {version}, which {lock.constraint} does "
                            "not: run `make lock`"
                        )
    return problems


def compile_locks(root: Path, *, upgrade: bool, uv: str) -> None:
    for lock in LOCKS:
        command = [
            uv, "pip", "compile", "--quiet", "--universal", "--generate-hashes",
            "--python-version", PYTHON_VERSION, "--custom-compile-command", "make lock",
        ]  # fmt: skip
        if lock.only:  # uv reads the requirements from stdin
            command.append("-")
            stdin = "\n".join(str(r) for r in requirements(root, lock))
        else:
            command += [*lock.sources]
            command += [arg for extra in lock.extras for arg in ("--extra", extra)]
            stdin = ""
        if lock.constraint:
            command += ["--constraint", lock.constraint]
        if upgrade:
            command.append("--upgrade")
        (root / lock.path).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [*command, "--output-file", lock.path], cwd=root, check=True, input=stdin, text=True
        )
        path = root / lock.path
        lines = path.read_text().splitlines(keepends=True)
        lines = [line for line in lines if not line.startswith(DIGEST_PREFIX)]
        header = next(i for i, line in enumerate(lines) if not line.startswith("#"))
        lines.insert(header, f"{DIGEST_PREFIX}{inputs_digest(root, lock)}\n")
        path.write_text("".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["compile", "check"])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--upgrade", action="store_true", help="compile: take the newest releases")
    parser.add_argument("--uv", default="uv", help="compile: the uv to run")
    args = parser.parse_args(argv)
    if args.command == "compile":
        compile_locks(args.root, upgrade=args.upgrade, uv=args.uv)
    problems = check(args.root)
    for problem in problems:
        print(f"lock-check: {problem}", file=sys.stderr)
    if not problems:
        print(f"lock-check: {', '.join(lock.path for lock in LOCKS)} are current")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""Byte-compile the portal's packages in the image, every one pyproject.toml ships
([tool.setuptools.packages.find] include), so that the list cannot fall behind a new app.

The image runs with PYTHONDONTWRITEBYTECODE=1 as a user who cannot write the code: what is
not compiled here is compiled again by every process that imports it.

    python3 deploy/docker/compile_packages.py [ROOT]
"""

from __future__ import annotations

import compileall
import fnmatch
import sys
import tomllib
from pathlib import Path


def packages(root: Path) -> list[str]:
    """The top-level packages under root that pyproject.toml's include patterns select."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted(
        path.name
        for path in root.iterdir()
        if (path / "__init__.py").is_file()
        and any(fnmatch.fnmatchcase(path.name, pattern) for pattern in include)
    )


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    names = packages(root)
    if not names:
        print(f"compile_packages: no packages found under {root}", file=sys.stderr)
        return 1
    ok = all([compileall.compile_dir(root / name, quiet=1) for name in names])
    print(f"compile_packages: {len(names)} packages: {' '.join(names)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

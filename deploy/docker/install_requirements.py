"""Print a project's dependencies from its pyproject.toml, one per line, for `pip install -r`,
with those of the extras named after it (`install_requirements.py pyproject.toml reports`).

The image installs them in a layer of their own, before the source is copied, so a
code change does not re-download every dependency.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

project = tomllib.loads(Path(sys.argv[1]).read_text())["project"]
extras = project.get("optional-dependencies", {})
print(
    "\n".join([*project["dependencies"], *(dep for extra in sys.argv[2:] for dep in extras[extra])])
)

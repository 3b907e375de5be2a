"""Print the project's dependencies from pyproject.toml, one per line, for `pip install -r`.

The image installs them in a layer of their own, before the source is copied, so a
code change does not re-download every dependency.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

project = tomllib.loads(Path(sys.argv[1]).read_text())["project"]
print("\n".join(project["dependencies"]))

"""The build hook of the agent's and labctl's distributions: their packages live at the
repository root, outside these projects. A wheel takes them in (force-include); an
editable install takes nothing, so that only the root on sys.path (dev-mode-dirs) serves
them and an edit to the code is live without installing again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class RootPackagesHook(BuildHookInterface):
    PLUGIN_NAME = "root-packages"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version == "editable":
            return
        for source, target in self.config["packages"].items():
            build_data["force_include"][str((Path(self.root) / source).resolve())] = target

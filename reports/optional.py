"""The libraries of the `reports` extra, imported when the work needs them.

The demand forecast's fit (statsmodels, pandas) and the PDF report (weasyprint) run on the
control worker; the web tier starts without them. A worker installed without the extra
says what to install instead of failing with a bare ImportError.
"""

from __future__ import annotations

import importlib
from types import ModuleType

INSTALL_HINT = "pip install 'labportal[reports]'"


class ReportsExtraMissing(RuntimeError):
    """A library of the `reports` extra is not installed."""


def require(module: str, purpose: str) -> ModuleType:
    """`module`, imported; ReportsExtraMissing naming the extra when it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ReportsExtraMissing(
            f"{purpose} needs {module.partition('.')[0]}, from the `reports` extra: "
            f"{INSTALL_HINT} ({exc})"
        ) from exc

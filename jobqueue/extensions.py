"""Where the apps above the job queue add to its pages and API, without it importing them.

Each app registers in its ``AppConfig.ready()``:
- ``register_job_page_context(provider)``: ``provider(job)`` returns names for the job's
  page (alerts/ adds the job's alerts, slurm/ what Slurm says of it);
- ``register_job_api_field(name, make_field)``: a read-only field of the job in the API
  (``make_field()`` builds it), in the place ``name`` has in ``JobSerializer.Meta.fields``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rest_framework.fields import Field

    from jobqueue.models import Job

JobPageContext = Callable[["Job"], dict[str, Any]]

_page_context: dict[str, JobPageContext] = {}
_api_fields: dict[str, Callable[[], Field[Any, Any, Any, Any]]] = {}


def register_job_page_context(key: str, provider: JobPageContext) -> None:
    """Registering the same ``key`` again replaces the provider (a reload, a test)."""
    _page_context[key] = provider


def job_page_context(job: Job) -> dict[str, Any]:
    context: dict[str, Any] = {}
    for provider in _page_context.values():
        context.update(provider(job))
    return context


def register_job_api_field(name: str, make_field: Callable[[], Field[Any, Any, Any, Any]]) -> None:
    _api_fields[name] = make_field


def job_api_fields() -> dict[str, Callable[[], Field[Any, Any, Any, Any]]]:
    return dict(_api_fields)

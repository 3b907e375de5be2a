"""The portal's Celery app, handed in by labportal/celery.py when it is made.

The apps that send messages by name (dispatch to node agents, the broker check of
/healthz) may not import labportal/ (layer 7), and `celery.current_app` is whichever
app was made last: in a process that also makes an agent's app (the tests do), that
is the agent's. So labportal/celery.py registers its app here.
"""

from __future__ import annotations

from celery import Celery

_app: Celery | None = None


def set_portal_app(app: Celery) -> None:
    global _app
    _app = app


def portal_app() -> Celery:
    """The portal's Celery app (labportal.celery.app)."""
    if _app is None:
        raise RuntimeError(
            "the portal's Celery app is not made yet: import labportal (Django's settings "
            "module labportal.settings does) before sending messages"
        )
    return _app

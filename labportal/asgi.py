"""The web tier's entry point (uvicorn): Django for every page and the API, and the
sessions proxy (``sessions.proxy``) for the paths that reach into jobs, HTTP and WebSocket.

A small router in front of Django rather than Django Channels: the proxy needs no
channel layer, no consumers and no groups, only a streamed HTTP request and a relayed
WebSocket, which plain ASGI gives (docs/architecture.md, "The web tier").
"""

from __future__ import annotations

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "labportal.settings")
# Before the settings load: under ASGI the database connections come from a pool
# (labportal/settings.py, "Database").
os.environ.setdefault("LABPORTAL_ASGI", "1")
django_application = get_asgi_application()

# After Django is set up: the proxy reads the settings and the models.
from sessions import proxy  # noqa: E402


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    kind = scope["type"]
    if kind == "lifespan":
        await _lifespan(receive, send)
    elif kind in ("http", "websocket") and proxy.handles(scope["path"]):
        await proxy.app(scope, receive, send)
    elif kind == "http":
        await django_application(scope, receive, send)
    else:  # a WebSocket to any other path: nothing listens there
        await receive()
        await send({"type": "websocket.close", "code": 4404})


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await proxy.client.close()
            await send({"type": "lifespan.shutdown.complete"})
            return

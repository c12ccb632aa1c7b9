"""ASGI entry point: HTTP through Django, websockets through Channels with session auth and an
origin check on scheme, host and port (console.asgi.SameOriginValidator)."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import ParseResult, urlparse

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

import django
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponseBase


class SyncChainASGIHandler(ASGIHandler):
    """Django's ASGI handler with the middleware chain and the view run in one thread hop.

    Django's own builds its chain for async mode: the sync middleware (WhiteNoise's, the
    console's) make a request cross from the event loop into a thread, back onto the loop for
    the view layer, and into the thread again for each view middleware and for the view (and
    Django's built-in middleware, if made to run async, would each cross twice more). Every
    crossing is a turn of the loop and a wakeup of another thread, all under one GIL. Here the
    chain is the sync one, as under WSGI, and all of it runs in the request's thread
    (``ThreadSensitiveContext``: one per request) in a single crossing. Async views still work
    (the sync chain runs them with async_to_sync), and a streamed response's async iterator
    (the SSE endpoint) is still sent from the loop."""

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)


django.setup(set_prefix=False)
django_asgi_app = SyncChainASGIHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import OriginValidator, WebsocketDenier  # noqa: E402
from django.conf import settings  # noqa: E402

from console.web.routing import websocket_urlpatterns  # noqa: E402


def allowed_origins(served_port: int | None) -> list[str]:
    """Full origins a console page may open a websocket from: CSRF_TRUSTED_ORIGINS as they are,
    and every ALLOWED_HOSTS name on the port this server was reached on. A bare host would let
    a page served by anything else on the same machine (another port) in; HTTP's CSRF check
    compares the port, so this does too."""
    origins = list(getattr(settings, "CSRF_TRUSTED_ORIGINS", []))
    if served_port is not None:
        for host in settings.ALLOWED_HOSTS:
            if host != "*":
                origins += [f"http://{host}:{served_port}", f"https://{host}:{served_port}"]
    return origins


def _served_port(scope: dict[str, Any], host: ParseResult | None) -> int | None:
    """The port this server was reached on; an ASGI server may leave ``server`` out (the
    spec allows it), and then the Host header the client sent says it."""
    server = scope.get("server")
    if server and len(server) > 1 and server[1] is not None:
        return int(server[1])
    try:
        return host.port if host is not None else None
    except ValueError:
        return None


class SameOriginValidator(OriginValidator):
    """Channels' OriginValidator with its list built per connection from the served port."""

    def __init__(self, application: Any) -> None:
        super().__init__(application, [])

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if self._same_origin(scope):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)

    def _same_origin(self, scope: dict[str, Any]) -> bool:
        try:
            origin: ParseResult | None = None
            host: ParseResult | None = None
            for name, value in scope.get("headers", []):
                if name == b"origin":
                    origin = urlparse(value.decode("latin1"))
                elif name == b"host":
                    host = urlparse("//" + value.decode("latin1"))
            if origin is None:
                return False
            port = _served_port(scope, host)
            if any(self.match_allowed_origin(origin, p) for p in allowed_origins(port)):
                return True
            return (
                "*" in settings.ALLOWED_HOSTS
                and origin.scheme in ("http", "https")
                and self.get_origin_port(origin) == port
            )
        except ValueError:
            # urllib raises on a port out of range or not a number (":99999",
            # ":8400.evil.example") and on a broken IPv6 literal: such an Origin or Host is
            # refused like a foreign one instead of failing the handshake with a 500.
            return False


application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

"""ASGI entry point: HTTP through Django, websockets through Channels with session auth and an
origin check against ALLOWED_HOSTS."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

from django.core.asgi import get_asgi_application

django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from console.daphne_compat import twisted_form_parsing_off  # noqa: E402
from console.web.routing import websocket_urlpatterns  # noqa: E402

# Uploads reach Django unparsed and streamed; malformed ones get the API's error body.
twisted_form_parsing_off()

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)

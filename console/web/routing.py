from django.urls import path, re_path

import console.converters  # noqa: F401  (registers the <id:...> converter)
from console.web import consumers

websocket_urlpatterns = [
    path("ws/tasks/<id:task_id>/", consumers.TaskJournalConsumer.as_asgi()),
    path("ws/feed/", consumers.FeedConsumer.as_asgi()),
    path("ws/presence/<str:queue>/", consumers.PresenceConsumer.as_asgi()),
    # Anything else (a NUL or a slash trick in an id, an unknown route) is closed with 4404
    # after the handshake instead of failing inside the router.
    re_path(r"", consumers.NoRouteConsumer.as_asgi()),
]

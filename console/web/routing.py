from django.urls import path

from console.web import consumers

websocket_urlpatterns = [
    path("ws/tasks/<str:task_id>/", consumers.TaskJournalConsumer.as_asgi()),
    path("ws/feed/", consumers.FeedConsumer.as_asgi()),
]

"""Path converters shared by the API, the pages and the websocket routes."""

from __future__ import annotations

from django.urls import register_converter


class IdConverter:
    """Ids are opaque to clients but made here (runtime.ids): a path segment that cannot be one
    (a NUL, a megabyte of text, a slash trick) is a 404 at routing instead of a value sent to
    the database."""

    regex = r"[A-Za-z0-9_-]{1,64}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(IdConverter, "id")

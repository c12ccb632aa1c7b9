"""A person's saved views of a console list (runtime.saved_views keeps them)."""

from __future__ import annotations

from runtime.actors import Actor
from runtime.models import SavedView


def saved_views_of(actor: Actor, page: str) -> list[SavedView]:
    """The person's views of ``page``, by name; none for anyone but a signed-in person."""
    if actor.kind != "user" or actor.user_id is None:
        return []
    return list(SavedView.objects.filter(user_id=actor.user_id, page=page).order_by("name", "id"))

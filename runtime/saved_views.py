"""A person's saved views: a console list's filters under a name, to open with one click (the
views a team on shift keeps: "refunds today", "my unresolved payments"). Personal state, not
work: no journal event; the right is the person's own (``can_keep_views``).

A view's query string keeps only the filters its page knows (``PAGE_FILTERS``), each within
its length, in a stable order, so a view never carries a stale or foreign parameter (a cursor,
a CSRF token) and two saves of the same filters are the same text."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode

from django.db import IntegrityError, transaction
from django.utils import timezone

from runtime.actors import Actor
from runtime.errors import Conflict, InvalidInput, NotFound
from runtime.models import SavedView
from runtime.policy import can_keep_views

# The filters each page's views may keep, in the order a view's query string lists them.
PAGE_FILTERS: dict[str, tuple[str, ...]] = {
    "tasks": ("q", "condition", "outcome", "since", "until", "param"),
}
MAX_VIEWS_PER_PAGE = 50
MAX_NAME = 80
MAX_VALUE = 400


def view_query(page: str, query: str) -> str:
    """The query string a view of ``page`` keeps: its known, non-empty filters, in order.
    Pure; InvalidInput for an unknown page or an over-long value."""
    known = PAGE_FILTERS.get(page)
    if known is None:
        raise InvalidInput(f"no list named {page!r} keeps views", field="page")
    given = dict(parse_qsl(query, keep_blank_values=False))
    kept = [(name, given[name].strip()) for name in known if given.get(name, "").strip()]
    if any(len(value) > MAX_VALUE for _, value in kept):
        raise InvalidInput(f"a filter's value is longer than {MAX_VALUE} characters")
    if not kept:
        raise InvalidInput("these filters show everything: choose one before saving a view")
    return urlencode(kept)


def saved_view_save(actor: Actor, *, page: str, name: str, query: str) -> SavedView:
    """Keep the page's current filters under ``name`` (a name used again on that page is
    Conflict). Preconditions: none; NotAuthorized unless a console person."""
    can_keep_views(actor)
    name = name.strip()
    if not name or len(name) > MAX_NAME:
        raise InvalidInput(f"a view's name is 1 to {MAX_NAME} characters", field="name")
    kept = view_query(page, query)
    assert actor.user_id is not None  # can_keep_views: a person
    mine = SavedView.objects.filter(user_id=actor.user_id, page=page)
    if mine.count() >= MAX_VIEWS_PER_PAGE:
        raise Conflict(f"you keep {MAX_VIEWS_PER_PAGE} views of this list: remove one first")
    try:
        with transaction.atomic():
            return SavedView.objects.create(
                user_id=actor.user_id, page=page, name=name, query=kept, created_at=timezone.now()
            )
    except IntegrityError:
        raise Conflict(f"you already keep a view named {name!r} here") from None


def saved_view_delete(actor: Actor, view_id: int) -> None:
    """Remove one of the person's own views (another's is NotFound, as if it did not exist)."""
    can_keep_views(actor)
    assert actor.user_id is not None  # can_keep_views: a person
    removed, _ = SavedView.objects.filter(pk=view_id, user_id=actor.user_id).delete()
    if not removed:
        raise NotFound("no such view")

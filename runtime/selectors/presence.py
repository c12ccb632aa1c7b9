"""Reads of presence (runtime.presence writes it): who else has a people's queue open now, and
the card each of them is on.

A page counts as open while its row is younger than ``PRESENCE_SECONDS``, decided at read time
like a claim's return (runtime.selectors.worklist): a page that vanished without a word drops
out by itself, with nothing to run. Only people who work the queue now are listed
(runtime.policy.can_work_on's rule on their roles, read now), and only to one who does."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q

from runtime.actors import Actor
from runtime.errors import NotFound
from runtime.models import Presence
from runtime.models.worklist import QUEUES
from runtime.policy import can_work_on
from runtime.selectors.worklist import people_for


@dataclass(frozen=True)
class Present:
    """One person with the place open: their username and the cards their pages are on (an
    approval request's or an operation's id; none while no card is current), sorted."""

    user_id: int
    name: str
    items: tuple[str, ...]


def presence_lasts() -> timedelta:
    return timedelta(seconds=float(settings.PRESENCE_SECONDS))


def presence_cutoff(now: datetime) -> datetime:
    """Pages not heard of since this have left."""
    return now - presence_lasts()


def expired(now: datetime) -> Q:
    return Q(seen_at__lt=presence_cutoff(now))


def place_checked(actor: Actor, place: str) -> None:
    """``place`` is a queue (NotFound otherwise) that ``actor`` works (NotAuthorized)."""
    if place not in QUEUES:
        raise NotFound(f"no such place: presence is kept on {', '.join(QUEUES)}")
    can_work_on(actor, place)


def present_others(actor: Actor, place: str, now: datetime) -> list[Present]:
    """The people other than ``actor`` who have ``place`` open at ``now``, by name. Refused
    (``place_checked``) to one who does not work the queue: nobody's name reaches them."""
    place_checked(actor, place)
    workers = dict(people_for(place))
    rows = (
        Presence.objects.filter(place=place, user_id__in=list(workers))
        .exclude(expired(now))
        .exclude(user_id=actor.user_id or 0)
        .values_list("user_id", "item")
    )
    items: dict[int, set[str]] = {}
    for user_id, item in rows:
        items.setdefault(user_id, set()).update([item] if item else [])
    found = [Present(pk, workers[pk], tuple(sorted(seen))) for pk, seen in items.items()]
    return sorted(found, key=lambda p: p.name)

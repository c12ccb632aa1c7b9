"""Presence: who else has a people's queue page (/approvals/, /unresolved/) open, and on which
card, so two people do not work the same item unknowingly (issue 39).

Where it is kept, and why: a database table (runtime.models.Presence), one row per open page,
its ``seen_at`` refreshed while the page stays open. The console runs in two modes, and the
database is the one store both share between every process that serves a page: in services
mode several web processes (their sockets' consumers) write and read it, and the Django cache
there is per process; in the embedded mode (SQLite, one process, Channels' in-memory layer) it
is the same table. It survives a web process's restart, and what that process's pages said
simply ages out. The rows are ephemeral by rule, not by store: one counts while it is younger
than ``PRESENCE_SECONDS`` (read time, runtime.selectors.presence), so a tab killed or a network
lost without a clean disconnect drops out of the others' lists by itself; rows older than that
are removed when any page next reports in, so the table holds about one row per open page.

The live part is Channels' (console.web.consumers.PresenceConsumer): each page's socket records
itself on connect and every third of ``PRESENCE_SECONDS``, removes itself on disconnect, and
tells the place's group, whose consumers each read the list again, with their own right.

Only a person who works the queue (runtime.policy.can_work_on, roles read now) is recorded, and
only such a person is told who is there."""

from __future__ import annotations

import re
from datetime import datetime

from django.db import IntegrityError, transaction
from django.utils import timezone

from runtime.actors import Actor
from runtime.errors import Conflict, InvalidInput
from runtime.models import Presence
from runtime.selectors.presence import expired, place_checked

# An item is the id of a card (runtime.ids: a prefix, "_", base32), as console.converters reads
# one from a path; the connection a Channels channel name.
_ITEM = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_CONNECTION = 200


def _valid(connection: str, item: str | None) -> None:
    if not connection or len(connection) > MAX_CONNECTION:
        raise InvalidInput(f"a connection is named by 1 to {MAX_CONNECTION} characters")
    if item and not _ITEM.fullmatch(item):
        raise InvalidInput("an item is the id of a card (letters, digits, _ and -)")


def _clear_expired(now: datetime) -> None:
    """Remove the rows that no longer count. Every open page does this at its beat: rows
    another page is removing (locked) are skipped, so two never wait on each other, nor
    deadlock by taking the same rows in different orders."""
    with transaction.atomic():
        gone = Presence.objects.filter(expired(now)).select_for_update(skip_locked=True)
        Presence.objects.filter(pk__in=list(gone.values_list("pk", flat=True))).delete()


def presence_record(actor: Actor, place: str, connection: str, *, item: str | None = None) -> bool:
    """Record that ``actor``'s page ``connection`` has ``place`` open now, on card ``item``
    (None: the card it said last; "": none). True when the others' lists change by it: the page
    is new (or back after it had expired) or moved to another card.

    Preconditions: ``place`` is a queue (NotFound) that ``actor`` works (NotAuthorized, roles
    read now); ``connection`` 1 to MAX_CONNECTION characters and ``item`` an id (InvalidInput);
    ``connection`` is not another person's or place's page (Conflict)."""
    place_checked(actor, place)
    _valid(connection, item)
    now, user_id = timezone.now(), actor.user_id or 0
    _clear_expired(now)
    with transaction.atomic():
        mine = Presence.objects.filter(connection=connection, user_id=user_id, place=place)
        row = mine.select_for_update().first()
        if row is not None:
            moved = item is not None and item != row.item
            row.seen_at, row.item = now, row.item if item is None else item
            row.save(update_fields=["seen_at", "item"])
            return moved
        try:
            with transaction.atomic():
                Presence.objects.create(
                    user_id=user_id,
                    place=place,
                    connection=connection,
                    item=item or "",
                    seen_at=now,
                )
        except IntegrityError:
            raise Conflict("that connection is another page's") from None
    return True


def presence_leave(actor: Actor, connection: str) -> bool:
    """``actor``'s page ``connection`` is closed: it leaves the others' lists now. True when it
    was there. Allowed to anyone, for their own page (one who lost the right leaves too)."""
    deleted, _ = Presence.objects.filter(connection=connection, user_id=actor.user_id or 0).delete()
    return deleted > 0

"""Websocket consumers for live pages. The journal is the source of truth: each consumer follows
it from the client's cursor and sends every event exactly once, in order. Channel-layer hints
only wake it early; in embedded mode (in-memory layer, which a worker process cannot reach) the
follower's own polling keeps pages live.

Refusals are sent as close codes after the handshake (4401 not logged in, 4403 no console role,
4404 no such task or route; in general 4000 + the HTTP status console.api.errors.classify gives
the error, the one mapping the API and the pages use too): a close before accepting reaches a
browser as a failed handshake (1006), which looks like a network fault, so the page would keep
reconnecting forever. A live socket rechecks its principal every ``TOKEN_RECHECK_SECONDS``
with the rule every open stream follows (runtime.policy.can_keep_streaming): logging out or
being deactivated closes it with 4401, losing the role with 4403.

``PresenceConsumer`` follows no journal: it keeps its page's presence (runtime.presence) and
tells its browser who else has the same queue open, as that changes (see its docstring).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.utils import timezone

from console.api.errors import classify
from console.api.serializers import event_out
from runtime import events as journal
from runtime import policy
from runtime.actors import Actor, actor_for_user
from runtime.errors import DomainError
from runtime.presence import presence_leave, presence_record
from runtime.selectors.presence import present_others
from runtime.selectors.tasks import task_get

log = logging.getLogger(__name__)

CLOSE_UNAUTHORIZED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
CLOSE_SERVER_ERROR = 1011
# Cursors are bigint in the journal; anything larger means "nothing yet".
MAX_CURSOR = 2**63 - 1


def _poll_seconds() -> float:
    # Hints arrive over Redis in services mode; polling there is only a safety net.
    return 0.5 if settings.EMBEDDED_BROKER else 2.0


def _after(scope: dict[str, Any]) -> int:
    query = parse_qs(scope.get("query_string", b"").decode("latin1"))
    try:
        return min(MAX_CURSOR, max(0, int(query.get("after", ["0"])[0])))
    except ValueError:
        return 0


def _recheck_seconds() -> float:
    return float(settings.TOKEN_RECHECK_SECONDS)


Right = Callable[[Actor], None]


def _authority(actor: Actor, session_key: str | None, right: Right) -> int | None:
    """The close code this socket deserves now (4000 + the refusal's status: 4401, 4403), or None
    while it may stay open. The session is read fresh from the store: the scope's copy was
    loaded at connect and never changes."""
    try:
        policy.can_keep_streaming(actor, right, session_key=session_key)
    except DomainError as exc:
        return 4000 + exc.status
    return None


class _Refusing(AsyncJsonWebsocketConsumer):
    async def _refuse(self, code: int) -> None:
        await self.accept()
        await self.close(code=code)

    async def websocket_connect(self, message: dict[str, Any]) -> None:
        try:
            await super().websocket_connect(message)
        except Exception as exc:
            known = classify(exc)
            if known is None:
                raise
            await self._refuse(4000 + known[0])


class NoRouteConsumer(_Refusing):
    async def connect(self) -> None:
        await self._refuse(CLOSE_NOT_FOUND)


class _Person(_Refusing):
    """A socket a signed-in person with a console role opens (4401, 4403 otherwise)."""

    actor: Actor

    async def _actor(self) -> Actor | None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self._refuse(CLOSE_UNAUTHORIZED)
            return None
        actor = await database_sync_to_async(actor_for_user)(user.pk, user.get_username())
        if not policy.allowed(policy.can_use_console, actor):
            await self._refuse(CLOSE_FORBIDDEN)
            return None
        self.actor = actor
        return actor

    def _right(self, actor: Actor) -> None:
        """The right the socket was opened under, asked again at each recheck."""
        policy.can_use_console(actor)

    async def _recheck(self) -> int | None:
        session = self.scope.get("session")
        key = getattr(session, "session_key", None)
        return await database_sync_to_async(_authority)(self.actor, key, self._right)


class _Follower(_Person):
    group: str = ""
    cursor: int = 0

    async def _start(self) -> None:
        self._wake = asyncio.Event()
        if self.channel_layer is not None:
            await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        self._loop = asyncio.ensure_future(self._follow())

    async def disconnect(self, code: int) -> None:
        loop = getattr(self, "_loop", None)
        if loop is not None:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await loop
        if self.channel_layer is not None and self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def journal_hint(self, message: dict[str, Any]) -> None:
        self._wake.set()

    async def _follow(self) -> None:
        clock = asyncio.get_running_loop().time
        checked = clock()
        try:
            while True:
                await self._drain()
                self._wake.clear()
                # Woken early by a hint; otherwise by the safety poll or the recheck, whichever
                # is due first.
                due = max(0.0, checked + _recheck_seconds() - clock())
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=min(_poll_seconds(), due))
                if clock() - checked >= _recheck_seconds():
                    checked = clock()
                    code = await self._recheck()
                    if code is not None:
                        await self.close(code=code)
                        return
        except Exception:
            # A follower that died quietly would leave a page "live" that never moves: close,
            # and the page reconnects from its cursor.
            log.exception("live follower of %s failed", self.group)
            with contextlib.suppress(Exception):
                await self.close(code=CLOSE_SERVER_ERROR)

    async def _drain(self) -> None:
        raise NotImplementedError


class TaskJournalConsumer(_Follower):
    """``ws/tasks/<id>/?after=N``: every event of the task after N, each once, in order."""

    async def connect(self) -> None:
        actor = await self._actor()
        if actor is None:
            return
        task_id = self.scope["url_route"]["kwargs"]["task_id"]
        # A refusal (NotFound: 4404) is mapped in _Refusing.websocket_connect.
        await database_sync_to_async(task_get)(actor, task_id)
        self.task_id = task_id
        self.group = journal.TASK_GROUP.format(task_id=task_id)
        self.cursor = _after(self.scope)
        await self._start()

    async def _drain(self) -> None:
        while True:
            rows = await database_sync_to_async(journal.events_after)(
                self.task_id, self.cursor, 200
            )
            for event in rows:
                await self.send_json({"type": "event", "event": event_out(event)})
                self.cursor = event.seq
            if len(rows) < 200:
                return

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # The page is read-only over this socket; actions go through forms and the REST API.
        return


class FeedConsumer(_Follower):
    """``ws/feed/?after=N``: a hint per journal event of any task, for list pages to refresh."""

    async def connect(self) -> None:
        if await self._actor() is None:
            return
        self.group = journal.FEED_GROUP
        self.cursor = _after(self.scope) or await database_sync_to_async(journal.feed_head)()
        await self._start()

    async def _drain(self) -> None:
        rows = await database_sync_to_async(journal.feed_after)(self.cursor, 500)
        if rows:
            self.cursor = rows[-1].id
            await self.send_json(
                {
                    "type": "hint",
                    "position": self.cursor,
                    "tasks": sorted({e.task_id for e in rows}),
                }
            )

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        return


PRESENCE_GROUP = "presence.{place}"


def _beat_seconds() -> float:
    """How often an open page says it is still there: a third of its lifetime, so one late or
    lost beat never makes a present person vanish (and never a busy loop, whatever is set)."""
    return max(0.1, float(settings.PRESENCE_SECONDS) / 3)


class PresenceConsumer(_Person):
    """``ws/presence/<queue>/``: who else has this queue's page open ("Also here"), and the card
    each of them is on, sent as ``{"type": "presence", "people": [{"name", "items"}]}`` at
    connect and whenever it changes. Only for a person who works the queue
    (runtime.policy.can_work_on: 4403; 4404 for a place that is no queue), rechecked every
    ``TOKEN_RECHECK_SECONDS`` like every live socket.

    The page's presence is recorded at connect, every third of ``PRESENCE_SECONDS`` and when the
    browser says it is on another card (``{"type": "looking", "item": id or ""}``); removed at
    disconnect. Each change is a hint to the place's group; every consumer there then reads
    the list again itself (runtime.selectors.presence, its own right read now), so a name
    reaches only one who may see it. The beat rereads the list too: one whose page vanished
    without a disconnect drops out when its row expires."""

    place: str = ""
    group: str = ""
    _shown: list[dict[str, Any]] | None = None

    def _right(self, actor: Actor) -> None:
        policy.can_work_on(actor, self.place)

    async def connect(self) -> None:
        actor = await self._actor()
        if actor is None:
            return
        place = self.scope["url_route"]["kwargs"]["queue"]
        # Refusals (NotFound 4404, NotAuthorized 4403) are mapped in _Refusing.websocket_connect.
        await database_sync_to_async(presence_record)(actor, place, self.channel_name)
        self.place, self.group = place, PRESENCE_GROUP.format(place=place)
        self._wake = asyncio.Event()
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self._tell_others()
        self._loop = asyncio.ensure_future(self._watch())

    async def disconnect(self, code: int) -> None:
        loop = getattr(self, "_loop", None)
        if loop is not None:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await loop
        if not self.place:
            return  # refused: nothing was recorded
        await self.channel_layer.group_discard(self.group, self.channel_name)
        if await database_sync_to_async(presence_leave)(self.actor, self.channel_name):
            await self._tell_others()

    async def presence_changed(self, message: dict[str, Any]) -> None:
        self._wake.set()

    async def _tell_others(self) -> None:
        await self.channel_layer.group_send(self.group, {"type": "presence.changed"})

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not (isinstance(content, dict) and content.get("type") == "looking" and self.place):
            return
        item = content.get("item")
        if not isinstance(item, str):
            return
        try:
            moved = await database_sync_to_async(presence_record)(
                self.actor, self.place, self.channel_name, item=item
            )
        except DomainError:
            return  # not an id, or the right is gone (the recheck closes the socket)
        if moved:
            await self._tell_others()

    async def _show(self) -> None:
        """Send the browser the list, if it differs from the one it has."""
        people = await database_sync_to_async(present_others)(
            self.actor, self.place, timezone.now()
        )
        shown = [{"name": p.name, "items": list(p.items)} for p in people]
        if shown != self._shown:
            await self.send_json({"type": "presence", "people": shown})
            self._shown = shown

    async def _beat(self) -> None:
        """Say the page is still here (a row that had expired meanwhile is an arrival)."""
        if await database_sync_to_async(presence_record)(self.actor, self.place, self.channel_name):
            await self._tell_others()
        # Renewed, as the layer forgets a group's members after its group_expiry (a day).
        await self.channel_layer.group_add(self.group, self.channel_name)

    async def _watch(self) -> None:
        clock = asyncio.get_running_loop().time
        checked = beat = clock()
        try:
            while True:
                self._wake.clear()
                await self._show()
                due = min(checked + _recheck_seconds(), beat + _beat_seconds()) - clock()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=max(0.0, due))
                if clock() - checked >= _recheck_seconds():
                    checked = clock()
                    code = await self._recheck()
                    if code is not None:
                        await self.close(code=code)
                        return
                if clock() - beat >= _beat_seconds():
                    beat = clock()
                    await self._beat()
        except DomainError as exc:
            # The principal changed between two rechecks and the read refused it (nothing was
            # sent): closed as the recheck says why (a deactivated account is 4401, not 4403).
            code = await self._recheck()
            await self.close(code=code or 4000 + exc.status)
        except Exception:
            log.exception("presence on %s failed", self.group)
            with contextlib.suppress(Exception):
                await self.close(code=CLOSE_SERVER_ERROR)

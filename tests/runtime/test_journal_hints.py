"""Journal hints on the Redis channel layer (services mode): a flush asks once which of its
groups anybody is in, and sends only to those. A ``group_send`` to a group nobody is in still
cost two Redis round trips in the committing process's hint thread, for every task with events
and for the feed, although under load almost no task has a page open."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer

from runtime import events
from runtime.events import FEED_GROUP, TASK_GROUP, event_hint
from tests.conftest import wait_for

pytestmark = [pytest.mark.postgres]


def test_a_flush_sends_only_to_the_groups_someone_is_in(monkeypatch):
    layer = get_channel_layer()
    # The services pass (marker postgres) always runs with REDIS_URL: the layer is Redis's.
    assert isinstance(layer, RedisChannelLayer), type(layer)
    watched, unwatched = f"tsk_{uuid.uuid4().hex}", f"tsk_{uuid.uuid4().hex}"
    reader = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(TASK_GROUP.format(task_id=watched), reader)
    sent: list[str] = []
    real = layer.group_send

    async def counted(group: str, message: dict[str, Any]) -> None:
        sent.append(group)
        await real(group, message)

    monkeypatch.setattr(layer, "group_send", counted)
    try:
        event_hint(unwatched, 3, "operation.claimed")
        event_hint(watched, 7, "operation.succeeded")
        wait_for(lambda: sent, what="the flush")
        got = async_to_sync(layer.receive)(reader)
    finally:
        async_to_sync(layer.group_discard)(TASK_GROUP.format(task_id=watched), reader)
    assert (got["task"], got["seq"]) == (watched, 7)
    # The unwatched task's group was not sent to (the feed is, if some earlier test's reader
    # is still in it).
    assert TASK_GROUP.format(task_id=watched) in sent
    assert TASK_GROUP.format(task_id=unwatched) not in sent


def test_a_layer_that_cannot_say_who_watches_is_sent_every_hint():
    class Plain:
        """A channel layer with only the public interface."""

    assert async_to_sync(events._watched)(Plain(), ["task.x", FEED_GROUP]) is None

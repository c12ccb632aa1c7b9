"""A live socket stays up in services mode (real server, real Redis): the channel layer's
receive blocks in Redis for ``brpop_timeout`` at a time, and a read timeout of the Redis client
shorter than that block made every idle socket fail and close after 5 s (pages reconnected in a
loop, and the socket's own session recheck never came round)."""

from __future__ import annotations

import json
import time

import pytest
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer

from tests import factories
from tests.conftest import journal_note
from tests.streams import session_of, websocket

pytestmark = [pytest.mark.postgres]

# Long enough for an idle socket's receive to block, time out in Redis and block again (the
# broken read timeout equalled one block, so one block and a bit crosses it).
QUIET_SECONDS = 1.4 * RedisChannelLayer.brpop_timeout


def test_the_channel_layer_s_read_timeout_outlasts_its_blocking_receive():
    layer = get_channel_layer()
    # The services pass (marker postgres) always runs with REDIS_URL: the layer is Redis's.
    assert isinstance(layer, RedisChannelLayer), type(layer)
    # A connection as the layer's pool makes them (unconnected): the client's defaults apply.
    timeout = layer.create_pool(0).make_connection().socket_timeout
    assert timeout is None or timeout > layer.brpop_timeout


def test_an_idle_socket_stays_open_and_still_delivers(server):
    task = factories.task(factories.agent())
    operator = factories.console_user("operator")
    with websocket(
        server, f"/ws/tasks/{task.pk}/?after=1", session_of(operator.actor_user())
    ) as ws:
        deadline = time.monotonic() + QUIET_SECONDS
        # Nothing happens on the task: every read times out quietly until the deadline. A socket
        # the server dropped raises ConnectionClosed here instead.
        while (left := deadline - time.monotonic()) > 0:
            with pytest.raises(TimeoutError):
                ws.recv(timeout=left)
        journal_note(task.pk, "after the quiet")
        message = json.loads(ws.recv(timeout=30))
    assert message["type"] == "event"
    assert (message["event"]["id"], message["event"]["type"]) == ("2", "task.note")

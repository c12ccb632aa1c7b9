"""The websocket origin check compares scheme, host and port, as HTTP's CSRF check does: the
console's own origin (an ALLOWED_HOSTS name on the port the server was reached on) and the
CSRF_TRUSTED_ORIGINS are let in; the same host on another port is not."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator

from console.asgi import application

pytestmark = [pytest.mark.postgres]


def _handshake(origin: bytes | None, host: bytes = b"127.0.0.1:8000") -> bool:
    headers = [(b"host", host)]
    if origin is not None:
        headers.append((b"origin", origin))

    async def scenario() -> bool:
        comm = WebsocketCommunicator(application, "/ws/feed/", headers=headers)
        try:
            connected, _ = await comm.connect(timeout=10)
            # Anonymous: accepted at the handshake, then closed with 4401 by the consumer.
            return bool(connected)
        finally:
            await comm.disconnect()

    return bool(async_to_sync(scenario)())


@pytest.mark.parametrize(
    "origin",
    [b"http://127.0.0.1:8000", b"http://localhost:8000", b"https://127.0.0.1:8000"],
)
def test_the_consoles_own_origin_passes(transactional_db, origin):
    assert _handshake(origin)


@pytest.mark.parametrize(
    "origin",
    [
        b"http://127.0.0.1:9999",
        b"http://localhost:9999",
        b"http://127.0.0.1",
        b"http://evil.example:8000",
        b"ws://127.0.0.1:9999",
        b"null",
        None,
    ],
)
def test_another_port_or_host_is_refused_at_the_handshake(transactional_db, origin):
    assert not _handshake(origin)


def test_the_port_is_the_one_the_server_was_reached_on(transactional_db):
    assert _handshake(b"http://127.0.0.1:9999", host=b"127.0.0.1:9999")
    assert not _handshake(b"http://127.0.0.1:8000", host=b"127.0.0.1:9999")


def test_csrf_trusted_origins_pass_with_their_scheme_and_port(transactional_db, settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://console.example"]
    assert _handshake(b"https://console.example")
    assert _handshake(b"https://console.example:443")
    assert not _handshake(b"http://console.example")
    assert not _handshake(b"https://console.example:8443")

"""Hostile headers get a clear 4xx, never a 500: the public documents and the health check
ignore a bad bearer token (they authenticate nobody) and answer errors as JSON; a websocket
handshake whose Origin (or Host) urllib cannot parse is refused like a foreign one. Over the
real server (console.server) and, for the origin check, the ASGI application itself."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator

from tests.api.support import raw_http, request_bytes

pytestmark = pytest.mark.postgres

BAD_TOKENS = ["garbage", "ac_000000000000_" + "x" * 43, "ac_x"]
MALFORMED_ORIGINS = [
    "http://127.0.0.1:99999",
    "http://127.0.0.1:8400.evil.example",
    "http://127.0.0.1:-1",
    "http://[::1",
]


def test_public_routes_ignore_a_bad_token(server):
    for token in BAD_TOKENS:
        for path in ["/api/schema/", "/api/schema/?format=json", "/api/docs/", "/healthz"]:
            data = request_bytes("GET", path, headers={"Authorization": f"Bearer {token}"})
            status, _, _, body = raw_http(server.url, data)
            assert status == 200, (token, path, body[:300])
    data = request_bytes("GET", "/api/schema/?format=json", headers={"Authorization": "Bearer x"})
    assert json.loads(raw_http(server.url, data)[3])["openapi"].startswith("3.")


def test_a_format_the_docs_do_not_have_is_a_json_error_not_a_500(server):
    for token in [None, *BAD_TOKENS]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        for path in ["/api/docs/?format=json", "/api/schema/?format=xml"]:
            data = request_bytes("GET", path, headers=headers)
            status, _, answer_headers, body = raw_http(server.url, data)
            assert status == 404, (token, path, status, body[:300])
            assert answer_headers["content-type"].startswith("application/json")
            assert json.loads(body)["error"]["code"] == "not_found"


def _handshake(origin: str, port: int) -> bytes:
    return (
        "GET /ws/feed/ HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\n"
        "Upgrade: websocket\r\n"
        "Connection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n"
        f"Origin: {origin}\r\n\r\n"
    ).encode("latin1")


def test_a_websocket_origin_with_a_malformed_port_is_refused_not_a_500(server):
    port = int(server.url.rsplit(":", 1)[1])
    for origin in MALFORMED_ORIGINS:
        status, _, _, body = raw_http(server.url, _handshake(origin, port))
        assert status == 403, (origin, body[:300])
    # The check itself still lets the server's own origin in.
    status, _, _, _ = raw_http(server.url, _handshake(f"http://127.0.0.1:{port}", port))
    assert status != 403
    assert "Traceback" not in server.log.read_text()


def test_the_origin_check_refuses_what_it_cannot_parse(transactional_db):
    from console.asgi import application

    async def connect(origin: str, host: str) -> bool:
        comm = WebsocketCommunicator(
            application,
            "/ws/feed/",
            headers=[(b"origin", origin.encode()), (b"host", host.encode())],
        )
        connected, _ = await comm.connect()
        await comm.disconnect()
        return bool(connected)

    for origin in MALFORMED_ORIGINS:
        for host in ["127.0.0.1:8400", "127.0.0.1:99999", "[::1"]:
            assert not async_to_sync(connect)(origin, host), (origin, host)

"""The MCP gateway's edge, driven through the server's own ASGI application (console.asgi) in
both modes: every request to /mcp takes one place of its token's rate (runtime.throttle), and
one past the burst, like one without a valid token, is answered from its head (429 or 401, the
contract's error as a JSON-RPC error's data, the connection closed) without its body ever
being read: the request below never sends its body, and a read would wait for it."""

from __future__ import annotations

import gc
import json
import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator
from django.test import override_settings

from console import asgi
from runtime import ratelimits
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)

PING = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
SMALL = {"API_RATE_PER_SECOND": 0.5, "API_RATE_BURST": 3}


@pytest.fixture(autouse=True)
def standing_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    now = float(int(time.time()))
    monkeypatch.setattr(ratelimits, "clock", lambda: now)
    # The counters of Redis (services mode) are per token: a new token starts afresh.


@pytest.fixture(autouse=True)
def threads_released() -> Any:
    """The gateway reads the database in worker threads: their connections go with them."""
    yield
    gc.collect()


def _mcp(token: str | None, *, send_body: bool) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        headers = [
            (b"host", b"testserver"),
            (b"content-type", b"application/json"),
            (b"accept", b"application/json, text/event-stream"),
            (b"content-length", str(len(PING)).encode()),
        ]
        if token is not None:
            headers.append((b"authorization", f"Bearer {token}".encode()))
        comm = HttpCommunicator(asgi.application, "POST", "/mcp", headers=headers)
        if send_body:
            await comm.send_input({"type": "http.request", "body": PING})
        start = await comm.receive_output(20)
        body = b""
        while True:
            message = await comm.receive_output(20)
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await comm.wait(5)
        return {
            "status": start["status"],
            "headers": {k.lower(): v for k, v in start["headers"]},
            "body": json.loads(body),
        }

    return async_to_sync(go)()


@override_settings(**SMALL)
def test_each_request_counts_once_and_a_refusal_comes_from_the_head():
    agent = factories.agent()
    for _ in range(3):
        served = _mcp(agent.token, send_body=True)
        assert served["status"] == 200, served
        assert "result" in served["body"]  # the ping answered
    refused = _mcp(agent.token, send_body=False)
    assert refused["status"] == 429
    assert refused["headers"][b"retry-after"] == b"2"
    assert refused["headers"][b"connection"] == b"close"
    assert refused["body"]["error"]["data"]["code"] == "rate_limited"
    assert refused["body"]["id"] is None


@pytest.mark.parametrize("token", [None, "ac_not_a_token"])
def test_no_valid_token_is_refused_from_the_head(token):
    refused = _mcp(token, send_body=False)
    assert refused["status"] == 401
    assert refused["headers"][b"www-authenticate"].startswith(b"Bearer")
    assert refused["headers"][b"connection"] == b"close"
    assert refused["body"]["error"]["data"]["code"] == "not_authenticated"

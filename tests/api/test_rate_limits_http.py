"""Brute-force limits over real sockets to the real server (console.server): an agent's
parallel calls with its good token are all served, however many arrive at once, and failures
are counted per client address, told apart by the connection's own source address (the
loopback network has many: 127.0.0.1 and 127.0.0.2 are two clients)."""

from __future__ import annotations

import http.client
import json
import threading
from urllib.parse import urlparse

import pytest

from tests import factories

pytestmark = pytest.mark.postgres

CONCURRENT = 40


def _get(base_url: str, path: str, token: str, source: str = "127.0.0.1") -> tuple[int, bytes]:
    url = urlparse(base_url)
    conn = http.client.HTTPConnection(
        url.hostname, url.port, timeout=60, source_address=(source, 0)
    )
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_concurrent_requests_with_one_good_token_are_all_served(server):
    token = factories.agent().token
    barrier = threading.Barrier(CONCURRENT)
    statuses: list[int] = []
    lock = threading.Lock()

    def call() -> None:
        barrier.wait(timeout=30)
        status, _ = _get(server.url, "/api/v1/tasks", token)
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=call) for _ in range(CONCURRENT)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(statuses) == [200] * CONCURRENT


def test_garbage_tokens_from_one_address_do_not_limit_another(server):
    for n in range(10):
        status, _ = _get(server.url, "/api/v1/tasks", f"garbage-{n}", source="127.0.0.1")
        assert status == 401
    status, body = _get(server.url, "/api/v1/tasks", "garbage", source="127.0.0.2")
    assert status == 401, body
    assert json.loads(body)["error"]["code"] == "not_authenticated"

"""Per-token API rate (runtime.throttle): an agent calling in a loop with its token is refused
past its burst (429 ``rate_limited`` with Retry-After, nothing done), other tokens and console
sessions are not, and honest parallel calls are all served: requests are counted as they
arrive, never by how many are in flight. Counted once per request whichever way it comes in:
DRF's authentication, or the ASGI edge that authenticates a POST from its head before reading
its body. Time is moved with a fake clock (runtime.ratelimits.clock), not slept through."""

from __future__ import annotations

import gc
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import redis
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator
from django.conf import settings
from django.db import connections
from django.test import override_settings
from rest_framework.test import APIClient

from console import asgi
from runtime import ratelimits
from runtime.models import RateCounter, Task
from runtime.ratelimits import RateLimited
from runtime.throttle import token_throttle
from tests import factories
from tests.api.support import assert_error, post_json
from tests.conftest import ROOT, Server, free_port, http_ok, server_start, wait_for

pytestmark = [pytest.mark.django_db]

# A token every 2 s, 3 at once: past the burst a request waits 2 s.
SMALL = {"API_RATE_PER_SECOND": 0.5, "API_RATE_BURST": 3}
CONCURRENT = 50
BACKENDS = ["redis", "database"]


class FakeClock:
    def __init__(self) -> None:
        self.now = float(int(time.time()))

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(ratelimits, "clock", fake)
    return fake


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Where the counting happens: Redis (services mode), or the database (embedded mode, and
    services mode while Redis is away)."""
    if request.param == "redis":
        if not settings.REDIS_URL:
            pytest.skip("Redis counts only in services mode")
    else:
        monkeypatch.setattr(ratelimits, "redis_or_none", lambda backend: None)
    return str(request.param)


def _refused(response: Any, retry_after: int) -> None:
    error = assert_error(response, 429, "rate_limited")
    assert "token" in error["message"]
    assert response["Retry-After"] == str(retry_after)


# --- a loop is refused, through DRF's authentication ----------------------------------------


@override_settings(**SMALL)
def test_a_loop_with_one_token_is_refused_past_its_burst_until_time_moves(clock, backend):
    looping, other = factories.agent(), factories.agent()
    client = looping.client()
    for _ in range(3):
        assert client.get("/api/v1/tasks").status_code == 200
    # Past the burst: refused, again and again, each refusal spending nothing (the wait stays
    # 2 s instead of growing with every knock).
    for _ in range(5):
        _refused(client.get("/api/v1/tasks"), 2)
    # Refused before any work: no task was created.
    _refused(post_json(client, "/api/v1/tasks", {"name": "from a loop"}), 2)
    assert not Task.objects.exists()
    # Another token is not affected.
    for _ in range(3):
        assert other.client().get("/api/v1/tasks").status_code == 200
    # One request per 2 s sustained.
    clock.now += 2
    assert post_json(client, "/api/v1/tasks", {"name": "in time"}).status_code == 201
    _refused(client.get("/api/v1/tasks"), 2)
    # Idle for the whole burst's length: the burst is back, and no more.
    clock.now += 6
    for _ in range(3):
        assert client.get("/api/v1/tasks").status_code == 200
    _refused(client.get("/api/v1/tasks"), 2)


@override_settings(**SMALL, RATE_TOKEN_PER_ACCOUNT=100, RATE_TOKEN_PER_ADDRESS=100)
def test_bad_tokens_are_left_to_the_failure_limits_and_spend_nothing_of_the_rate(clock):
    agent = factories.agent()
    prefix = agent.token.rsplit("_", 1)[0]
    guesser = APIClient()
    guesser.credentials(HTTP_AUTHORIZATION=f"Bearer {prefix}_{'A' * 43}")
    for _ in range(5):
        assert_error(guesser.get("/api/v1/tasks"), 401, "not_authenticated")
    client = agent.client()
    for _ in range(3):
        assert client.get("/api/v1/tasks").status_code == 200
    _refused(client.get("/api/v1/tasks"), 2)


@override_settings(**SMALL)
def test_a_token_acting_for_a_person_is_limited_but_the_persons_session_is_not(clock):
    person = factories.console_user("operator")
    scripted = person.client()
    for _ in range(3):
        assert scripted.get("/api/v1/tasks").status_code == 200
    _refused(scripted.get("/api/v1/tasks"), 2)
    browser = APIClient()
    browser.force_login(person.actor_user())
    for _ in range(10):
        assert browser.get("/api/v1/tasks").status_code == 200


@override_settings(API_RATE_PER_SECOND=0, API_RATE_BURST=3)
def test_a_rate_of_zero_turns_the_limit_off(clock):
    client = factories.agent().client()
    for _ in range(10):
        assert client.get("/api/v1/tasks").status_code == 200


# --- the ASGI edge: a POST is authenticated from its head, counted there once -----------------


@pytest.fixture
def request_threads() -> Iterator[None]:
    """The ASGI handler keeps its request threads (and their database connections) for later
    requests: close those connections so none outlives the test."""
    yield
    for executor in list(asgi._threads._free):
        executor.submit(connections.close_all).result(timeout=10)
    gc.collect()


def _asgi(method: str, path: str, token: str, body: bytes = b"") -> dict[str, Any]:
    """The answer of the server's own ASGI application (console.asgi), as the server sends it."""

    async def go() -> dict[str, Any]:
        headers = [(b"host", b"testserver"), (b"authorization", f"Bearer {token}".encode())]
        if body:
            headers += [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ]
        comm = HttpCommunicator(asgi.application, method, path, headers=headers)
        await comm.send_input({"type": "http.request", "body": body})
        start = await comm.receive_output(10)
        parts = []
        while True:
            message = await comm.receive_output(10)
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        await comm.wait()
        return {
            "status": start["status"],
            "headers": {k.lower(): v for k, v in start["headers"]},
            "body": b"".join(parts),
        }

    return async_to_sync(go)()


@pytest.mark.django_db(transaction=True)
@override_settings(**SMALL)
def test_the_edge_counts_a_post_once_and_refuses_it_before_its_body(clock, request_threads):
    agent = factories.agent()
    body = json.dumps({"name": "from the edge"}).encode()
    # The burst is 3 and every POST is served: the edge's authentication counted each once (the
    # view takes the principal the edge found instead of authenticating again).
    for _ in range(3):
        answer = _asgi("POST", "/api/v1/tasks", agent.token, body)
        assert answer["status"] == 201, answer["body"][:300]
    refused = _asgi("POST", "/api/v1/tasks", agent.token, body)
    assert refused["status"] == 429
    assert json.loads(refused["body"])["error"]["code"] == "rate_limited"
    assert refused["headers"][b"retry-after"] == b"2"
    # Answered from the head: the body unread, the connection closed after the answer.
    assert refused["headers"][b"connection"] == b"close"
    assert Task.objects.count() == 3
    # A GET (no body: DRF's own authentication) takes its place in the same count.
    clock.now += 2
    assert _asgi("GET", "/api/v1/tasks", agent.token)["status"] == 200
    assert _asgi("POST", "/api/v1/tasks", agent.token, body)["status"] == 429
    assert Task.objects.count() == 3


# --- honest parallel calls ------------------------------------------------------------------
# Threads in this process write at once only on PostgreSQL: the embedded suite's SQLite test
# database is shared-cache in memory, where a second writer fails at once ("table is locked")
# instead of waiting as on the embedded mode's file. The embedded mode's own concurrency is
# tested over HTTP against an embedded server (the last test).


def _all_at_once(call: Callable[[], Any], n: int) -> list[Any]:
    """``call`` from ``n`` threads released together; each thread's answer."""
    barrier = threading.Barrier(n)
    answers: list[Any] = []
    lock = threading.Lock()

    def run() -> None:
        try:
            barrier.wait(timeout=30)
            answer = call()
            with lock:
                answers.append(answer)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return answers


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_fifty_concurrent_honest_calls_are_all_served_and_counted(clock, backend):
    # The default rate (50/s, a burst of 200), the clock standing still: every concurrent call
    # is served, and each took exactly one place of the burst.
    assert (settings.API_RATE_PER_SECOND, settings.API_RATE_BURST) == (50, 200)
    agent = factories.agent()
    answers = _all_at_once(lambda: agent.client().get("/api/v1/tasks").status_code, CONCURRENT)
    assert answers == [200] * CONCURRENT
    client = agent.client()
    for _ in range(200 - CONCURRENT):
        assert client.get("/api/v1/tasks").status_code == 200
    _refused(client.get("/api/v1/tasks"), 1)


# --- the counter itself: atomic under real concurrency ----------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@override_settings(API_RATE_PER_SECOND=1, API_RATE_BURST=5)
def test_of_concurrent_requests_at_one_moment_exactly_the_burst_is_admitted(backend):
    token_id = uuid.uuid4().hex
    now = float(int(time.time()))

    def request() -> int:
        try:
            token_throttle(token_id, now=now)
        except RateLimited as exc:
            return -exc.retry_after
        return 0

    answers = _all_at_once(request, 16)
    assert answers.count(0) == 5
    # Each refused one waits until a place frees: 1 s at one request per second.
    assert sorted(a for a in answers if a) == [-1] * 11


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@override_settings(API_RATE_PER_SECOND=1, API_RATE_BURST=2)
def test_while_redis_is_away_the_rate_is_counted_in_the_database(monkeypatch):
    away = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0")
    monkeypatch.setattr(ratelimits, "_redis", lambda: away)
    token_id, now = uuid.uuid4().hex, float(int(time.time()))
    for _ in range(2):
        token_throttle(token_id, backend="redis", now=now)
    with pytest.raises(RateLimited):
        token_throttle(token_id, backend="redis", now=now)
    key = f"ratelimit:api-rate:{token_id}"
    assert RateCounter.objects.filter(key=key).exists()
    assert not redis.Redis.from_url(settings.REDIS_URL).exists(key)


# --- over real sockets to the real server -------------------------------------------------


Answer = tuple[int, dict[str, str], bytes]


def _http(base_url: str, method: str, path: str, token: str, body: bytes | None = None) -> Answer:
    url = urlparse(base_url)
    conn = http.client.HTTPConnection(str(url.hostname), url.port, timeout=60)
    headers = {"Authorization": f"Bearer {token}"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def _parallel_calls(base_url: str, token: str, n: int) -> list[Answer]:
    """``n`` calls with one token at once, every other one a GET (DRF's authentication) or a
    POST with a body (the edge's, from the head)."""
    body = json.dumps({"name": "parallel"}).encode()
    counter = iter(range(n))
    lock = threading.Lock()

    def call() -> Answer:
        with lock:
            k = next(counter)
        if k % 2:
            return _http(base_url, "POST", "/api/v1/tasks", token, body)
        return _http(base_url, "GET", "/api/v1/tasks", token)

    return _all_at_once(call, n)


def _served(answers: list[Answer]) -> int:
    return sum(status in (200, 201) for status, _, _ in answers)


def _assert_rate_limited(answer: Answer) -> None:
    status, headers, content = answer
    assert status == 429, content[:300]
    assert json.loads(content)["error"]["code"] == "rate_limited"
    assert int(headers["Retry-After"]) >= 1


def _honest_and_greedy(base_url: str, honest: str, greedy: str, burst: int | None) -> None:
    """Fifty calls at once with the ``honest`` token are all served; with a ``burst`` (and a
    rate too slow to matter), the next is refused, and of more calls at once than the burst
    with the ``greedy`` token exactly the burst is served."""
    answers = _parallel_calls(base_url, honest, CONCURRENT)
    assert sorted(status for status, _, _ in answers) == [200] * 25 + [201] * 25
    after = _http(base_url, "GET", "/api/v1/tasks", honest)
    if burst is None:
        assert after[0] == 200
        return
    _assert_rate_limited(after)
    answers = _parallel_calls(base_url, greedy, burst + 10)
    assert _served(answers) == burst
    for answer in answers:
        if answer[0] not in (200, 201):
            _assert_rate_limited(answer)


# Fifty at once, and a token per 1000 s: the test ends long before a place frees.
BURST_OF_50 = {"API_RATE_BURST": "50", "API_RATE_PER_SECOND": "0.001"}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("burst", [None, 50], ids=["default-rate", "burst-of-50"])
def test_fifty_concurrent_honest_calls_over_http_are_all_served(tmp_path: Path, burst):
    server = server_start(tmp_path, **(BURST_OF_50 if burst else {}))
    try:
        _honest_and_greedy(server.url, factories.agent().token, factories.agent().token, burst)
    finally:
        server.stop()


def _embedded_env(data_dir: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "CONSOLE_", "CELERY_"))
        and k not in ("DATABASE_URL", "REDIS_URL", "TEST_DATABASE_NAME", "DEMO_TOOLS")
    }
    env.update(
        DJANGO_SETTINGS_MODULE="console.settings",
        CONSOLE_DATA_DIR=str(data_dir),
        PYTHONUNBUFFERED="1",
        **BURST_OF_50,
    )
    return env


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.system
def test_the_embedded_server_counts_in_its_sqlite_database_as_atomically(tmp_path: Path):
    """The embedded mode as users start it (SQLite in WAL mode, no Redis): the rate counted in
    the database by guarded UPDATEs under real concurrency, over real sockets."""
    env = _embedded_env(tmp_path / "data")
    _manage(env, "migrate", "--noinput")
    honest, greedy = (
        _manage(env, "create_agent_token", name).strip().splitlines()[-1]
        for name in ("honest", "greedy")
    )
    port = free_port()
    log = tmp_path / "web.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "console.server", "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    server = Server(f"http://127.0.0.1:{port}", proc, log)
    try:
        wait_for(lambda: http_ok(f"{server.url}/healthz"), timeout=60, what="the embedded server")
        _honest_and_greedy(server.url, honest, greedy, 50)
    finally:
        server.stop()

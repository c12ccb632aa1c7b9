"""The web server's HTTP handler (console.asgi.SyncChainASGIHandler): the middleware chain and
the view cross from the event loop into the request's thread once, and what the chain does
(authentication, CSRF, the error mapping, the security headers, streamed responses) is what
it did under Django's own ASGI handler. Requests go through the ASGI application itself, as
the server hands them over."""

from __future__ import annotations

import gc
import threading
from typing import Any

import pytest
from asgiref.sync import SyncToAsync, async_to_sync, iscoroutinefunction
from channels.testing import HttpCommunicator
from django.core import signals
from django.core.handlers.asgi import ASGIHandler
from django.db import connections
from django.test import Client

from console import asgi
from console.asgi import application, django_asgi_app
from tests import factories

pytestmark = [pytest.mark.django_db(transaction=True)]

HOST = [(b"host", b"testserver")]


@pytest.fixture(autouse=True)
def _threads_connections_closed() -> Any:
    """Each request runs in a thread kept for later requests, which opens its own database
    connection (the server pools them; the suite's settings keep them): close the idle
    threads' ones, and collect the finished threads', so none outlives its test."""
    yield
    for executor in list(asgi._threads._free):
        executor.submit(connections.close_all).result(timeout=10)
    gc.collect()


def _request(
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]],
    body: bytes = b"",
    *,
    app: Any = application,
) -> Any:
    """The response as the server would send it: status, headers (names lower-cased) and the
    body's parts joined (a streamed body's last message may carry none, which ASGI allows).
    Returns once ``app`` has finished with the request."""

    async def go() -> Any:
        length = [(b"content-length", str(len(body)).encode())] if body else []
        comm = HttpCommunicator(app, method, path, headers=HOST + headers + length)
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


def _bearer(secret: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {secret}".encode())]


def test_the_chain_and_its_view_middleware_run_sync():
    # Django's handler builds both for async mode: a coroutine chain with sync middleware and
    # view middleware each wrapped to cross into a thread.
    assert not iscoroutinefunction(django_asgi_app._middleware_chain)
    assert django_asgi_app._view_middleware  # CSRF's
    assert not any(iscoroutinefunction(m) for m in django_asgi_app._view_middleware)


def _crossings(monkeypatch: Any, app: Any, path: str, secret: str) -> list[str]:
    """What a GET through ``app`` ran in a thread, in order, until it finished the request."""
    crossings: list[str] = []
    original = SyncToAsync.__call__

    async def counted(self: SyncToAsync, *args: Any, **kwargs: Any) -> Any:
        crossings.append(getattr(self.func, "__qualname__", repr(self.func)))
        return await original(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(SyncToAsync, "__call__", counted)
        response = _request("GET", path, _bearer(secret), app=app)
    assert response["status"] == 200, response["body"][:300]
    return crossings


def test_a_request_crosses_into_a_thread_once_for_its_chain_and_view(monkeypatch):
    """One crossing: the request_started signal, the chain with the view, and closing the
    response (whose body is whole in memory) before it is sent. Django's own handler, on the
    same request, crossed for the signal, for the chain, for CSRF's view middleware, for the
    view and for the close, each after a turn back on the loop."""
    agent = factories.agent()
    task = factories.task(agent)
    path = f"/api/v1/tasks/{task.pk}"
    ours = _crossings(monkeypatch, application, path, agent.token)
    assert ours == ["SyncChainASGIHandler._respond"]
    stock = _crossings(monkeypatch, ASGIHandler(), path, agent.token)
    assert len(stock) >= 5, stock


def test_api_reads_writes_and_refusals_keep_their_answers():
    agent = factories.agent()
    task = factories.task(agent)
    read = _request("GET", f"/api/v1/tasks/{task.pk}", _bearer(agent.token))
    assert read["status"] == 200
    headers = read["headers"]
    assert b"default-src 'self'" in headers[b"content-security-policy"]
    assert headers[b"x-frame-options"] == b"DENY"

    body = b'{"tool": "demo.echo", "step": "s1", "params": {"x": 1}}'
    json_headers = [*_bearer(agent.token), (b"content-type", b"application/json")]
    proposed = _request("POST", f"/api/v1/tasks/{task.pk}/operations", json_headers, body)
    assert proposed["status"] == 201, proposed["body"][:300]
    assert task.operations.count() == 1

    anonymous = _request("GET", f"/api/v1/tasks/{task.pk}", [])
    assert anonymous["status"] == 401
    assert b'"code"' in anonymous["body"]
    # The input edge refuses a NUL in the query before any view runs.
    nul = _request("GET", "/api/v1/tasks?q=a%00b", _bearer(agent.token))
    assert nul["status"] == 400


def test_a_page_form_without_its_csrf_token_is_refused():
    admin = factories.console_user("admin")
    agent = factories.agent()
    task = factories.task(agent)
    client = Client()
    assert client.login(username=admin.actor.name, password=factories.PASSWORD)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    form = [(b"cookie", cookie), (b"content-type", b"application/x-www-form-urlencoded")]
    refused = _request("POST", f"/tasks/{task.pk}/cancel", form, b"reason=stop")
    assert refused["status"] == 303  # back to the task's page, told nothing was done
    task.refresh_from_db()
    assert task.cancellation == "none"


def test_server_sent_events_still_stream_from_the_loop():
    agent = factories.agent()
    task = factories.task(agent)
    stream = _request(
        "GET",
        f"/api/v1/tasks/{task.pk}/events?max_seconds=0.3",
        [*_bearer(agent.token), (b"accept", b"text/event-stream")],
    )
    assert stream["status"] == 200
    assert stream["headers"][b"content-type"].startswith(b"text/event-stream")
    assert b"event: task.created" in stream["body"]


def test_a_request_runs_in_a_thread_an_earlier_request_left_idle():
    """The request's thread is kept for the next request instead of started and joined for
    each (Django's ThreadSensitiveContext() gave every request a new one)."""
    agent = factories.agent()
    task = factories.task(agent)
    seen: list[threading.Thread] = []

    def started(**_: Any) -> None:
        seen.append(threading.current_thread())

    signals.request_started.connect(started)
    try:
        for _ in range(3):
            assert (
                _request("GET", f"/api/v1/tasks/{task.pk}", _bearer(agent.token))["status"] == 200
            )
    finally:
        signals.request_started.disconnect(started)
    assert len(seen) == 3
    assert seen[0] is seen[1] is seen[2]
    assert seen[0] is not threading.main_thread()


def test_request_threads_serve_one_request_each_and_keep_at_most_their_idle_count():
    threads = asgi._RequestThreads(idle=1)
    first, second = threads.take(), threads.take()
    assert first is not second  # two requests at once: two threads
    threads.give(first)
    threads.give(second)  # past the idle count: ended
    assert threads.take() is first
    assert threads.take() is not second
    with pytest.raises(RuntimeError):
        second.submit(lambda: None)

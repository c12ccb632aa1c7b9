"""Fixtures for the Python client's tests: the real web server (console.server) on the test
database, and httpx transports that misbehave the way networks do."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.conftest import KeptProcesses, Server


class DropAfterForward(httpx.BaseTransport):
    """Forwards each request to the real server, reads the whole answer, and then (while
    ``drop`` says so) raises as if the connection broke before the answer arrived: the server
    did the work, the client never heard."""

    def __init__(self, drop: Callable[[httpx.Request], bool]) -> None:
        self.inner = httpx.HTTPTransport()
        self.drop = drop
        self.sent: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        response = self.inner.handle_request(request)
        response.read()
        if self.drop(request):
            raise httpx.ReadError("connection reset after the request was sent", request=request)
        return response


class CutStream(httpx.SyncByteStream):
    """A response body that breaks after ``keep`` chunks."""

    def __init__(self, inner: httpx.SyncByteStream, keep: int) -> None:
        self.inner, self.keep = inner, keep

    def __iter__(self) -> Iterator[bytes]:
        for n, chunk in enumerate(self.inner):
            if n >= self.keep:
                raise httpx.ReadError("stream cut")
            yield chunk

    def close(self) -> None:
        self.inner.close()


class Gate(httpx.BaseTransport):
    """Forwards requests; those ``hold`` picks wait until ``release`` is set."""

    def __init__(self, hold: Callable[[httpx.Request], bool]) -> None:
        self.inner = httpx.HTTPTransport()
        self.hold = hold
        self.release = threading.Event()
        self.held = threading.Event()
        self.sent: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        if self.hold(request):
            self.held.set()
            self.release.wait(60)
        return self.inner.handle_request(request)


@pytest.fixture
def short_lease_server(transactional_db: None, kept_processes: KeptProcesses) -> Iterator[Server]:
    """The web server granting 2-second leases (kept for the module, as ``server`` is)."""
    yield kept_processes.server(LEASE_SECONDS=2)
    kept_processes.settle()


# The browser tests' fixtures (Debian's chromium through Playwright), for the adapter's
# end-to-end test. Playwright keeps a loop running in this thread while the browser is up: the
# tests that use it run the agent in a process of its own.
from tests.browser.conftest import browser, context, page  # noqa: E402, F401

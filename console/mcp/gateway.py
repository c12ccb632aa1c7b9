"""The ``/mcp`` endpoint: MCP's streamable HTTP transport (the ``mcp`` package's, stateless,
JSON responses) in front of console.mcp.tools, mounted by console.asgi beside Django.

Who asks is known from the request's head before any of its body is read (console.edge's rule):
the API's own bearer authentication (runtime.tokens.token_authenticate, then the token's rate,
runtime.throttle: one count per request) runs on the head, and a request that names nobody, or
a bad, revoked or rate-limited token, is answered there (401 or 429, the contract's error as a
JSON-RPC error's data, the connection closed), its body never read. The Host must be one
ALLOWED_HOSTS names and an Origin, when a browser sends one, one the console's pages could have
(the websockets' rule): the spec's guard against DNS rebinding. Bodies are capped as the API's
are.

Stateless (no ``Mcp-Session-Id``): every request carries its token and names its task, so any
web process serves it and nothing is lost when one restarts. The SDK's session manager still
wants a task group of its own for the handshake-era requests; it is started on the first
request (the web server runs without an ASGI lifespan)."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.db import close_old_connections
from django.http.request import split_domain_port, validate_host
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.types import INVALID_REQUEST
from rest_framework import exceptions
from rest_framework.request import Request

from console.api.auth import BearerTokenAuthentication
from console.api.errors import error_body, exception_handler
from console.mcp.tools import SCOPE_KEY, Caller, mcp_server
from runtime.actors import Actor
from runtime.errors import DomainError

PATHS = ("/mcp", "/mcp/")
TASK_HEADER = b"console-task"
TASK_KEY_HEADER = b"console-task-key"
_BODY_LIMIT = 2_621_440  # Django's DATA_UPLOAD_MAX_MEMORY_SIZE default, as console.edge's

Refusal = tuple[int, dict[str, Any], dict[str, str]]


def is_mcp(path: str) -> bool:
    return path in PATHS


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _host_allowed(scope: dict[str, Any]) -> bool:
    """Django's own rule for the Host header (ALLOWED_HOSTS; the local names under DEBUG)."""
    host = _header(scope, b"host") or ""
    domain, _ = split_domain_port(host)
    allowed = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return bool(domain) and validate_host(domain, allowed)


def admit(scope: dict[str, Any]) -> Actor | Refusal:
    """The actor the head's bearer token stands for (its rate counted), or the refusal to
    answer without reading the body. Sync: it reads the database, and gives its connection back
    before the body arrives."""
    try:
        head = ASGIRequest(scope, io.BytesIO())
        try:
            found = BearerTokenAuthentication().authenticate(Request(head))
        except (exceptions.APIException, DomainError) as exc:
            return _refusal(exc)
        if found is None:
            return _refusal(exceptions.NotAuthenticated("a bearer token is required"))
        return found[1]
    finally:
        close_old_connections()


def _refusal(exc: Exception) -> Refusal:
    response = exception_handler(exc, {})
    assert response is not None, exc
    return response.status_code, dict(response.data), dict(response.items())


def caller_of(scope: dict[str, Any], actor: Actor) -> Caller:
    """The task the request names: ``?task=`` or ``Console-Task`` (a task id), ``?task_key=``
    or ``Console-Task-Key`` (the caller's external id for it)."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    task = (query.get("task") or [None])[0] or _header(scope, TASK_HEADER)
    key = (query.get("task_key") or [None])[0] or _header(scope, TASK_KEY_HEADER)
    return Caller(actor=actor, task_id=task or None, task_key=key or None)


async def _send_json(
    send: Any, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> None:
    """An answer given from the head, the body left unread: the connection closes after it,
    so the client stops sending. A JSON-RPC error (no id: the request was not read), carrying
    the contract's error as its ``data``: MCP clients show a JSON-RPC error's message, where
    they would show only "an error response" for any other body."""
    error = body["error"]
    rpc = {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": INVALID_REQUEST, "message": error["message"], "data": error},
    }
    data = json.dumps(rpc).encode()
    extra = {k.lower(): v for k, v in (headers or {}).items()}
    extra.update({"content-type": "application/json", "connection": "close"})
    extra["content-length"] = str(len(data))
    extra.setdefault("x-content-type-options", "nosniff")
    pairs = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]
    await send({"type": "http.response.start", "status": status, "headers": pairs})
    await send({"type": "http.response.body", "body": data})


class McpGateway:
    """The ASGI app serving ``/mcp`` (console.asgi routes to it). ``origin_allowed`` is the
    websockets' origin rule, given by console.asgi, which owns it."""

    def __init__(self, origin_allowed: Callable[[dict[str, Any]], bool]) -> None:
        self.origin_allowed = origin_allowed
        self._manager: StreamableHTTPSessionManager | None = None
        self._ready: asyncio.Future[None] | None = None
        self._runner: asyncio.Task[None] | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not _host_allowed(scope):
            await _send_json(send, 400, error_body("disallowed_host", "the Host is not served"))
            return
        if _header(scope, b"origin") is not None and not self.origin_allowed(scope):
            await _send_json(send, 403, error_body("not_authorized", "the Origin is not allowed"))
            return
        if scope["method"] != "POST":
            # Stateless: no stream for a GET to open (it could carry nothing, and would hold
            # its connection for ever), no session for a DELETE to end. The spec's answer.
            body = error_body("method_not_allowed", "the MCP endpoint takes POST only")
            await _send_json(send, 405, body, {"Allow": "POST"})
            return
        admitted = await sync_to_async(admit, thread_sensitive=False)(scope)
        if not isinstance(admitted, Actor):
            status, body, headers = admitted
            await _send_json(send, status, body, headers)
            return
        manager = await self._running()
        scope = {**scope, SCOPE_KEY: caller_of(scope, admitted)}
        await manager.handle_request(scope, receive, send)

    async def _running(self) -> StreamableHTTPSessionManager:
        loop = asyncio.get_running_loop()
        if self._ready is None or self._ready.get_loop() is not loop:
            # The first request of this process (the server runs one loop; a test driving the
            # application in a loop of its own gets a manager of its own).
            self._manager = None
            self._ready = loop.create_future()
            self._runner = loop.create_task(self._run(self._ready), name="mcp-sessions")
        await asyncio.shield(self._ready)
        assert self._manager is not None
        return self._manager

    async def _run(self, ready: asyncio.Future[None]) -> None:
        """The session manager's task group, for as long as this process serves."""
        manager = StreamableHTTPSessionManager(
            app=mcp_server(),
            stateless=True,
            json_response=True,
            max_request_body_size=getattr(settings, "DATA_UPLOAD_MAX_MEMORY_SIZE", None)
            or _BODY_LIMIT,
        )
        try:
            async with manager.run():
                self._manager = manager
                ready.set_result(None)
                await asyncio.Event().wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
                self._ready = None  # the next request tries again
            raise

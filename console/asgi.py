"""ASGI entry point: HTTP through Django (``/mcp`` through the MCP gateway, console.mcp),
websockets through Channels with session auth and an origin check on scheme, host and port
(console.asgi.SameOriginValidator)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import ParseResult, unquote, urlparse, urlsplit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

import asyncio
import io
import json
import logging
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import replace

import django
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.http import FileResponse, HttpRequest, HttpResponse, HttpResponseBase
from django.urls import set_script_prefix


class SyncChainASGIHandler(ASGIHandler):
    """Django's ASGI handler with the middleware chain and the view run in one thread hop.

    Django's own builds its chain for async mode: the sync middleware (WhiteNoise's, the
    console's) make a request cross from the event loop into a thread, back onto the loop for
    the view layer, and into the thread again for each view middleware and for the view (and
    Django's built-in middleware, if made to run async, would each cross twice more). Every
    crossing is a turn of the loop and a wakeup of another thread, all under one GIL. Here the
    chain is the sync one, as under WSGI, and all of it runs in the request's thread
    (``ThreadSensitiveContext``: one per request) in a single crossing. Async views still work
    (the sync chain runs them with async_to_sync), and a streamed response's async iterator
    (the SSE endpoint) is still sent from the loop.

    The request's thread is taken from those earlier requests left idle (``_RequestThreads``)
    instead of started for it and joined after it, as Django's ``ThreadSensitiveContext()``
    does: a thread's start and join, and what is built again per thread (the database
    connection's wrapper, Celery's per-thread backend), were about a tenth of the web process's
    samples holding the GIL under py-spy; an A/B of CPU per request across the running server
    was lost in this host's noise. It still serves one request at a time."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        scope = _origin_form(scope)
        if not scope["path"].startswith("/"):
            # "OPTIONS *", "CONNECT host:port", "GET ftp://...": no path names a page or a
            # route; refused as the server refuses a target it cannot parse.
            await _refused(send, 400, "malformed_request", "the request target is not a path")
            return
        answer = _Answer(send)
        executor = _threads.take()
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, answer)
        except Exception:
            # A failure outside Django's own handling, which would have made it a 500 in the
            # contract's format (the principal looked up from the head while the database is
            # away, ...): uvicorn would answer it in text/plain. An answer already begun is cut
            # off, as uvicorn does.
            if answer.begun:
                raise
            log.exception("request failed before its answer: %s %s", scope["method"], scope["path"])
            await _server_error(scope, send)
        finally:
            _threads.give(executor)

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)

    # A body is read only once the head has said who sends it, and only up to its route's
    # limit (console.edge); Django's own handler reads any body whole, to disk, first.

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = edge.framing(scope)
        if body is None:
            await self._serve(scope, receive, send)
            return
        admission, needs_principal = edge.route_admission(scope, body)
        if needs_principal:
            admission = await sync_to_async(edge.admit, thread_sensitive=True)(scope, admission)
        if not admission.refused:
            try:
                # Read through read_body below, then create_request.
                capped = _Capped(receive, admission.limit)
                await self._serve({**scope, _ADMISSION: admission}, capped, send)
                return
            except _BodyTooLarge:
                answer = edge.too_large(admission.upload, admission.limit)
                admission = replace(admission, refused=True, answer=answer)
        await self._answer_unread(scope, admission, send)

    async def _serve(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Django's ``handle`` with the request's sync work in one crossing: the request_started
        signal, the chain and the view, and, for a response whose body is whole in memory, its
        close (request_finished: the connection goes back to the pool) before its bytes are
        sent. Django crossed three times (the signal, the chain, the close), each a wakeup of
        the request's thread and one of the loop's under one GIL. A streamed response is sent
        from the loop while a disconnect is listened for, and closed after, as Django does."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            set_script_prefix(get_script_prefix(scope))
            respond = sync_to_async(self._respond, thread_sensitive=True)
            response, closed = await respond(scope, body_file)
            if closed:
                await self.send_response(response, send)
            else:
                await self._stream(response, receive, send)
        finally:
            body_file.close()

    def _respond(self, scope: dict[str, Any], body_file: Any) -> tuple[HttpResponseBase, bool]:
        """In the request's thread: the response, and whether it is closed already."""
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            error_response.close()
            return error_response, True
        response = self.get_response(request)
        response._handler_class = self.__class__  # type: ignore[attr-defined]  # as Django's
        if isinstance(response, FileResponse):
            response.block_size = self.chunk_size
        if response.streaming:
            return response, False
        response.close()
        return response, True

    async def _stream(self, response: HttpResponseBase, receive: Any, send: Any) -> None:
        """Send a streamed response until it ends or its client goes (Django's own way)."""
        tasks = [
            asyncio.create_task(self.listen_for_disconnect(receive)),
            asyncio.create_task(self.send_response(response, send)),
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                with suppress(RequestAborted):
                    task.result()
            else:
                task.cancel()
                with suppress(asyncio.CancelledError):
                    await task
        await sync_to_async(response.close, thread_sensitive=True)()

    async def read_body(self, receive: Any) -> Any:
        """Django's read_body, stopping as soon as the body passes its route's limit."""
        limit = receive.limit if isinstance(receive, _Capped) else None
        body_file = tempfile.SpooledTemporaryFile(  # noqa: SIM115 (Django closes it)
            max_size=settings.FILE_UPLOAD_MAX_MEMORY_SIZE, mode="w+b"
        )
        size = 0
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise RequestAborted()
                chunk = message.get("body", b"")
                size += len(chunk)
                if limit is not None and size > limit:
                    raise _BodyTooLarge()
                body_file.write(chunk)
                if not message.get("more_body", False):
                    break
        except BaseException:
            body_file.close()
            raise
        body_file.seek(0)
        return body_file

    def create_request(self, scope: Mapping[str, Any], body_file: Any) -> Any:
        admission = scope.get(_ADMISSION)
        if admission is None:
            return super().create_request(scope, body_file)
        # The body is whole now: its length is known even when it came chunked (Django's and
        # DRF's parsers read no body without a Content-Length).
        size = body_file.seek(0, io.SEEK_END)
        body_file.seek(0)
        request, error = super().create_request(_with_length(scope, size), body_file)
        if request is not None:
            edge.hand_over(request, admission)
        return request, error

    async def _answer_unread(
        self, scope: dict[str, Any], admission: edge.Admission, send: Any
    ) -> None:
        """The answer decided from the head, through the middleware chain (its headers), the
        body left unread; the connection closes after it, so the client stops sending."""
        set_script_prefix(get_script_prefix(scope))
        await signals.request_started.asend(sender=self.__class__, scope=scope)
        request, response = super().create_request(_with_length(scope, 0), io.BytesIO())
        if request is not None:
            if admission.answer is not None:
                request.edge_answer = admission.answer  # type: ignore[attr-defined]
            response = await self.run_get_response(request)
        assert isinstance(response, HttpResponse | HttpResponseBase)
        response["Connection"] = "close"
        await self.send_response(response, send)
        await sync_to_async(response.close)()


class _RequestThreads:
    """Single-thread executors for requests' sync code, each serving one request at a time and
    kept for the next once its request ended (all on the event loop's thread: no lock). At most
    ``idle`` wait; a burst past that starts threads that end with their request."""

    def __init__(self, idle: int) -> None:
        self.idle = idle
        self._free: list[ThreadPoolExecutor] = []

    def take(self) -> ThreadPoolExecutor:
        if self._free:
            return self._free.pop()
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="request")

    def give(self, executor: ThreadPoolExecutor) -> None:
        if len(self._free) < self.idle:
            self._free.append(executor)
        else:
            executor.shutdown(wait=False)


_threads = _RequestThreads(idle=64)


class _BodyTooLarge(Exception):
    """The body passed its route's limit while it arrived."""


class _Capped:
    """The server's receive, carrying the body limit to read_body (Django passes only it)."""

    def __init__(self, receive: Any, limit: int | None) -> None:
        self.receive = receive
        self.limit = limit

    async def __call__(self) -> Any:
        return await self.receive()


_ADMISSION = "console.admission"  # the scope key for what console.edge decided


class _Answer:
    """The server's send, noting whether the answer has begun."""

    __slots__ = ("begun", "send")

    def __init__(self, send: Any) -> None:
        self.send = send
        self.begun = False

    async def __call__(self, message: Mapping[str, Any]) -> None:
        self.begun = True
        await self.send(message)


async def _server_error(scope: Mapping[str, Any], send: Any) -> None:
    """The 500 console.web.views.server_error gives, without Django (whatever failed may fail
    again): the contract's JSON under /api/ (and for /healthz), a bare page otherwise."""
    path = scope["path"]
    if path.startswith("/api/") or path == "/healthz":
        await _refused(send, 500, "internal_error", "internal server error")
        return
    body = b"<!doctype html><title>Server error</title><h1>Server error</h1>"
    await _send_whole(send, 500, b"text/html; charset=utf-8", body)


async def _refused(send: Any, status: int, code: str, message: str) -> None:
    body = json.dumps(error_body(code, message)).encode()
    await _send_whole(send, status, b"application/json", body)


async def _send_whole(send: Any, status: int, content_type: bytes, body: bytes) -> None:
    """An answer of the server's own, the connection closed after it."""
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _origin_form(scope: dict[str, Any]) -> dict[str, Any]:
    """A request-target in absolute form (``GET http://host/api/v1/tasks``, which an HTTP/1.1
    server must accept, RFC 9112 3.2.2) as the origin form Django routes: its path, and the
    target's host in place of the Host header, as the RFC says (so ALLOWED_HOSTS judges the
    host the target names). uvicorn hands the whole URL on as the path, which names no route:
    a page's 404, even for an API URL. Any other target is left as it came."""
    if scope["path"].startswith("/"):
        return scope
    raw = scope.get("raw_path") or scope["path"].encode()
    url = urlsplit(raw.decode("latin1"))  # h11 lets only ASCII through
    if url.scheme.lower() not in ("http", "https") or not url.netloc:
        return scope
    raw_path = url.path or "/"
    host = url.netloc.rpartition("@")[2]  # without any userinfo
    headers = [(k, v) for k, v in scope["headers"] if k != b"host"]
    return {
        **scope,
        "path": unquote(raw_path),
        "raw_path": raw_path.encode("latin1"),
        "headers": [(b"host", host.encode("latin1")), *headers],
    }


def _with_length(scope: Mapping[str, Any], size: int) -> dict[str, Any]:
    headers = [
        (k, v) for k, v in scope["headers"] if k not in (b"content-length", b"transfer-encoding")
    ]
    return {**scope, "headers": [*headers, (b"content-length", str(size).encode())]}


django.setup(set_prefix=False)

from console import edge  # noqa: E402
from console.api.errors import error_body  # noqa: E402

log = logging.getLogger("console.asgi")

django_asgi_app = SyncChainASGIHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import OriginValidator, WebsocketDenier  # noqa: E402

from console.mcp.gateway import McpGateway, is_mcp  # noqa: E402
from console.web.routing import websocket_urlpatterns  # noqa: E402


def allowed_origins(served_port: int | None) -> list[str]:
    """Full origins a console page may open a websocket from: CSRF_TRUSTED_ORIGINS as they are,
    and every ALLOWED_HOSTS name on the port this server was reached on. A bare host would let
    a page served by anything else on the same machine (another port) in; HTTP's CSRF check
    compares the port, so this does too."""
    origins = list(getattr(settings, "CSRF_TRUSTED_ORIGINS", []))
    if served_port is not None:
        for host in settings.ALLOWED_HOSTS:
            if host != "*":
                origins += [f"http://{host}:{served_port}", f"https://{host}:{served_port}"]
    return origins


def _served_port(scope: dict[str, Any], host: ParseResult | None) -> int | None:
    """The port this server was reached on; an ASGI server may leave ``server`` out (the
    spec allows it), and then the Host header the client sent says it."""
    server = scope.get("server")
    if server and len(server) > 1 and server[1] is not None:
        return int(server[1])
    try:
        return host.port if host is not None else None
    except ValueError:
        return None


class SameOriginValidator(OriginValidator):
    """Channels' OriginValidator with its list built per connection from the served port."""

    def __init__(self, application: Any) -> None:
        super().__init__(application, [])

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if self._same_origin(scope):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)

    def _same_origin(self, scope: dict[str, Any]) -> bool:
        try:
            origin: ParseResult | None = None
            host: ParseResult | None = None
            for name, value in scope.get("headers", []):
                if name == b"origin":
                    origin = urlparse(value.decode("latin1"))
                elif name == b"host":
                    host = urlparse("//" + value.decode("latin1"))
            if origin is None:
                return False
            port = _served_port(scope, host)
            if any(self.match_allowed_origin(origin, p) for p in allowed_origins(port)):
                return True
            return (
                "*" in settings.ALLOWED_HOSTS
                and origin.scheme in ("http", "https")
                and self.get_origin_port(origin) == port
            )
        except ValueError:
            # urllib raises on a port out of range or not a number (":99999",
            # ":8400.evil.example") and on a broken IPv6 literal: such an Origin or Host is
            # refused like a foreign one instead of failing the handshake with a 500.
            return False


def _mcp_origin_allowed(scope: dict[str, Any]) -> bool:
    return SameOriginValidator(None)._same_origin(scope)


mcp_gateway = McpGateway(_mcp_origin_allowed)


class HttpRoutes:
    """``/mcp`` to the MCP gateway (console.mcp.gateway, an ASGI app of its own: the ``mcp``
    package's transport), everything else to Django."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope = _origin_form(scope)
        if not is_mcp(scope["path"]):
            await django_asgi_app(scope, receive, send)
            return
        answer = _Answer(send)
        try:
            await mcp_gateway(scope, receive, answer)
        except Exception:
            # As for Django's requests: a failure is the contract's 500, never a traceback.
            if answer.begun:
                raise
            log.exception("MCP request failed before its answer")
            await _refused(send, 500, "internal_error", "internal server error")


application = ProtocolTypeRouter(
    {
        "http": HttpRoutes(),
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

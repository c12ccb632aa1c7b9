"""The web server: uvicorn (h11 for HTTP/1.1, websockets' sans-I/O protocol for websockets)
serving console.asgi, with what uvicorn does not do the contract's way changed here: the
answers it gives itself, to a request it cannot parse (a malformed request line or header, a
request head past the size limit) or a websocket handshake it or the application refuses.

uvicorn answers those in ``text/plain``; here they get the contract's ``{"error": {...}}`` body,
and oversized heads get 431 (daphne closed the connection instead). Everything else is the
application's answer, with standard reason phrases (``422 Unprocessable Entity``, not daphne's
``Unknown Status``).

Run: ``python -m console.server --host 127.0.0.1 --port 8000`` (``make run`` and deploy/ do).
"""

from __future__ import annotations

import argparse
import http
import json
import os
import tempfile
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.datastructures import Headers
from websockets.http11 import Response

# h11's limit on a request's head (request line + headers); larger is a 431.
MAX_HEADER_BYTES = 16 * 1024

_CODES = {
    400: ("malformed_request", "the HTTP request is malformed"),
    431: ("request_header_too_large", f"request headers exceed {MAX_HEADER_BYTES} bytes"),
}


def _error_json(status: int, code: str | None = None, message: str | None = None) -> bytes:
    known = _CODES.get(status) or (
        {403: "not_authorized", 500: "internal_error"}.get(status, "malformed_request"),
        http.HTTPStatus(status).phrase.lower(),
    )
    body = {"error": {"code": code or known[0], "message": message or known[1]}}
    return json.dumps(body).encode()


def _head_size(request: h11.Request) -> int:
    return len(request.target) + sum(len(k) + len(v) + 4 for k, v in request.headers)


class ContractH11Protocol(H11Protocol):
    """uvicorn's h11 protocol whose own refusals are in the contract's error format."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refusal_status = 400
        next_event = self.conn.next_event

        def remembering_next_event() -> Any:
            # uvicorn drops the exception before answering; h11's hint (431 for a head past
            # the size limit) is what the answer should say.
            try:
                event = next_event()
            except h11.RemoteProtocolError as exc:
                self._refusal_status = exc.error_status_hint
                raise
            # h11 bounds only a head that arrives in pieces; one that came in a single read is
            # held to the same limit here.
            if isinstance(event, h11.Request) and _head_size(event) > MAX_HEADER_BYTES:
                self._refusal_status = 431
                raise h11.RemoteProtocolError("request head too large", error_status_hint=431)
            return event

        self.conn.next_event = remembering_next_event  # type: ignore[method-assign]

    def send_400_response(self, msg: str) -> None:
        status = self._refusal_status if self._refusal_status in _CODES else 400
        body = _error_json(status)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        reason = http.HTTPStatus(status).phrase.encode()
        for event in (
            h11.Response(status_code=status, headers=headers, reason=reason),
            h11.Data(data=body),
            h11.EndOfMessage(),
        ):
            try:
                self.transport.write(self.conn.send(event))
            except h11.LocalProtocolError:
                # h11 refuses to answer a request it never parsed as HTTP/1.1; say it raw.
                self.transport.write(
                    b"HTTP/1.1 %d %s\r\n" % (status, reason)
                    + b"".join(k + b": " + v + b"\r\n" for k, v in headers)
                    + b"\r\n"
                    + body
                )
                break
        self.transport.close()


class ContractWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets protocol whose HTTP refusals (a malformed handshake, a connection
    the application refused before accepting it) carry the contract's error body."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        reject = self.conn.reject

        def json_reject(status: Any, text: str) -> Response:
            plain = reject(status, text)
            body = _error_json(plain.status_code, message=text.strip() or None)
            headers = Headers(
                [(k, v) for k, v in plain.headers.raw_items() if k.lower() != "content-type"]
            )
            headers["Content-Type"] = "application/json"
            del headers["Content-Length"]
            headers["Content-Length"] = str(len(body))
            return Response(plain.status_code, plain.reason_phrase, headers, body)

        self.conn.reject = json_reject  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    import uvicorn  # noqa: PLC0415 (imported once the environment above is set)

    parser = argparse.ArgumentParser(description="Serve the console (HTTP + websockets).")
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    parser.add_argument(
        "--proxy-headers",
        action="store_true",
        help="trust X-Forwarded-Proto/For from FORWARDED_ALLOW_IPS (behind a TLS proxy)",
    )
    args = parser.parse_args(argv)
    # This process and its workers pool their database connections (database_pooled says
    # why): this process's settings are loaded already (the console package loads Celery's
    # app), so they are changed here, before anything connects; worker processes load theirs
    # with the mark set.
    os.environ["CONSOLE_WEB_SERVER"] = "1"
    from django.conf import settings  # noqa: PLC0415 (the settings read the environment set above)

    from console.settings import database_pooled  # noqa: PLC0415 (likewise)

    database_pooled(settings.DATABASES["default"], settings.DB_POOL_MAX)
    processes = max(1, int(os.environ.get("WEB_CONCURRENCY") or 1))
    if processes > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Several processes answer /metrics in turn: their request counters are kept in files
        # of one fresh directory that each of them reads (console.metrics).
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="console-metrics-")
    # By module name, not __main__'s: with several processes uvicorn hands them to its workers.
    from console.server import ContractH11Protocol, ContractWebSocketProtocol  # noqa: PLC0415 (by module name, for uvicorn's spawned workers)

    json_logs = settings.LOG_FORMAT == "json"
    uvicorn.run(
        "console.asgi:application",
        host=args.host,
        port=args.port,
        workers=processes,
        http=ContractH11Protocol,
        ws=ContractWebSocketProtocol,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        proxy_headers=args.proxy_headers,
        # Behind a proxy (--proxy-headers), trust its X-Forwarded-* from anywhere unless
        # FORWARDED_ALLOW_IPS narrows it (what daphne's --proxy-headers did).
        forwarded_allow_ips=os.environ.get(
            "FORWARDED_ALLOW_IPS", "*" if args.proxy_headers else "127.0.0.1"
        ),
        server_header=False,
        lifespan="off",
        log_level=os.environ.get("WEB_LOG_LEVEL", "info"),
        # LOG_FORMAT=json: uvicorn's own lines go through the settings' JSON formatter too, in
        # every process: the parent of several (which never loads the app, so never runs
        # django.setup()) is given the settings' LOGGING here.
        log_config=settings.LOGGING if json_logs else uvicorn.config.LOGGING_CONFIG,
    )


if __name__ == "__main__":
    main()

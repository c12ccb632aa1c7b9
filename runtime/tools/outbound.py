"""One HTTP request from a worker to a URL an admin chose (a notification webhook, a declared
HTTP tool), through the address guard (runtime.address_guard), with its outcome classified the
way every adapter reports it:

- nothing left this process (the URL or its host refused, no DNS answer, the connection refused
  or not made in time): ``ToolFailure.TRANSIENT``, or ``PERMANENT`` for what never will work
  (a URL or an address the guard refuses);
- the request was sent, or partly, and no whole answer came back (a timeout, a reset):
  ``ToolFailure.UNKNOWN``: the receiver may have acted;
- an answer: ``answer_check`` passes a 2xx and raises for the rest (408, 409, 425, 429 and 5xx
  transient, any other status permanent).

The standard library's http.client over a socket this module connects itself, to an address the
guard checked: a client library would resolve the host again when it connects, and the second
answer is not the one the guard judged."""

from __future__ import annotations

import http.client
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from runtime.address_guard import NOTIFY_SWITCH, PrivateHost, host_addresses, url_validate
from runtime.errors import InvalidInput
from runtime.tools.base import ToolFailure

# Statuses that say "not now" rather than "never": a retry may succeed.
TRANSIENT_STATUSES = frozenset({408, 409, 425, 429})


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes  # at most the ``limit`` asked for
    complete: bool  # False when the body was longer than the limit
    content_type: str
    host: str


def http_request(
    method: str,
    url: str,
    *,
    body: bytes | None,
    headers: dict[str, str],
    timeout: float,
    switch: str = NOTIFY_SWITCH,
    limit: int = 2000,
) -> Answer:
    """Send one request to ``url`` over a connection to an address the guard accepted (no second
    lookup a DNS answer could change in between); ``switch`` names the setting that lets this
    use reach private addresses. Raises ToolFailure as the module docstring says. Preconditions:
    no transaction open (the caller's invocation runs outside one)."""
    parts, address, port = _guarded_address(url, switch)
    host = parts.hostname or ""
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    conn = _connection(host, address, port, https=parts.scheme == "https", timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read(limit + 1)
        return Answer(
            status=response.status,
            body=data[:limit],
            complete=len(data) <= limit,
            content_type=response.getheader("Content-Type") or "",
            host=host,
        )
    except Exception as exc:
        # Sent, or partly: the receiver may have acted.
        raise ToolFailure(ToolFailure.UNKNOWN, f"no answer from {host}: {exc!r}"[:500]) from None
    finally:
        conn.close()


def _guarded_address(url: str, switch: str) -> tuple[SplitResult, str, int]:
    """The URL's parts, the address the guard accepted for its host, and the port; a URL or
    address the guard refuses is a permanent failure, a name that does not resolve a transient
    one."""
    try:
        # Checked again before each request: an environment's URL was never typed into a form.
        url_validate(url, switch=switch)
    except InvalidInput as exc:
        raise ToolFailure(ToolFailure.PERMANENT, exc.message) from None
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = host_addresses(host, port, switch=switch)
    except PrivateHost as exc:
        raise ToolFailure(ToolFailure.PERMANENT, str(exc)) from None
    except OSError as exc:
        raise ToolFailure(ToolFailure.TRANSIENT, f"cannot resolve {host}: {exc}") from None
    return parts, addresses[0], port


def _connection(
    host: str, address: str, port: int, *, https: bool, timeout: float
) -> http.client.HTTPConnection:
    """A connection to ``address`` for ``host`` (TLS checked against the host's name); failing
    to connect is transient, nothing was sent."""
    try:
        sock = socket.create_connection((address, port), timeout=timeout)
    except OSError as exc:
        # Refused, unreachable or not connected in time: nothing was sent.
        raise ToolFailure(ToolFailure.TRANSIENT, f"cannot connect to {host}: {exc}") from None
    if not https:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        conn.sock = sock
        return conn
    context = ssl.create_default_context()
    tls = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
    try:
        tls.sock = context.wrap_socket(sock, server_hostname=host)
    except (OSError, ssl.SSLError) as exc:
        sock.close()
        # The handshake carries no request: nothing was sent.
        raise ToolFailure(ToolFailure.TRANSIENT, f"TLS with {host} failed: {exc}") from None
    return tls


def answer_check(answer: Answer) -> None:
    """Pass a 2xx; raise ToolFailure for any other status (TRANSIENT_STATUSES and 5xx: try
    again later; the rest: this request will never succeed as it is)."""
    status = answer.status
    if 200 <= status < 300:
        return
    text = answer.body.decode("utf-8", "replace")[:200]
    kind = (
        ToolFailure.TRANSIENT
        if status in TRANSIENT_STATUSES or status >= 500
        else ToolFailure.PERMANENT
    )
    raise ToolFailure(kind, f"{answer.host} answered {status}: {text}")

"""Helpers shared by the API tests: the error format check and JSON requests."""

from __future__ import annotations

import json
from typing import Any

from rest_framework.test import APIClient

TASK_FIELDS = {
    "id",
    "name",
    "condition",
    "outcome",
    "state_version",
    "attempt",
    "cancellation",
    "paused",
    "deadline",
    "pending",
    "created_at",
}

OPERATION_FIELDS = {
    "id",
    "task",
    "attempt",
    "kind",
    "tool",
    "step",
    "params",
    "params_hash",
    "idempotency_key",
    "status",
    "attempts_used",
    "max_attempts",
    "lease_generation",
    "state_version",
    "result",
    "error",
    "approval",
    "invocations",
}


def assert_error(response: Any, status: int, code: str | None = None) -> dict[str, Any]:
    """The response is ``status`` with the contract's error body (and ``code`` when given)."""
    assert response.status_code == status, (response.status_code, response.content[:500])
    body = json.loads(response.content)
    assert set(body) == {"error"}, body
    assert isinstance(body["error"]["code"], str) and body["error"]["code"]
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code, body
    return dict(body["error"])


def post_raw(client: APIClient, path: str, raw: str | bytes, **headers: Any) -> Any:
    """POST a body exactly as given (malformed on purpose, or with a chosen encoding)."""
    return client.post(path, data=raw, content_type="application/json", **headers)


def post_json(client: APIClient, path: str, body: Any, **headers: Any) -> Any:
    return post_raw(client, path, json.dumps(body), **headers)


def raw_http(base_url: str, data: bytes, chunks: int = 1) -> tuple[int, str, dict[str, str], bytes]:
    """Send ``data`` as is over a real socket to the server at ``base_url`` (in ``chunks``
    writes) and read the answer until the server closes: (status, reason, headers, body)."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(base_url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        step = max(1, -(-len(data) // chunks))
        try:
            for start in range(0, len(data), step):
                sock.sendall(data[start : start + step])
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered before the rest arrived (a 431, a 413): read it
        return read_answer(sock)


def read_answer(sock: Any) -> tuple[int, str, dict[str, str], bytes]:
    """An HTTP/1.1 answer read from ``sock`` until its body is whole (a 101's head is whole), or
    the server closes (or resets: a server closing on unread input), blocking with the socket's
    timeout: (status, reason, headers with repeated ones joined by ", ", body)."""
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break  # the answer was read before the reset
        if not chunk:
            break
        received += chunk
        head, sep, rest = received.partition(b"\r\n\r\n")
        if sep and head.startswith(b"HTTP/1.1 101 "):
            break  # switching protocols: no body follows, the connection stays open
        if sep and b"content-length:" in head.lower():
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            if len(rest) >= length:
                break
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin1").split("\r\n")
    _, status, reason = status_line.split(" ", 2)
    headers: dict[str, str] = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        key = name.strip().lower()
        headers[key] = ", ".join(filter(None, [headers.get(key), value.strip()]))
    return int(status), reason, headers, body


def request_bytes(
    method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> bytes:
    """An HTTP/1.1 request, byte for byte, that closes the connection after the answer."""
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin1") + body

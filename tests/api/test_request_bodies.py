"""Bodies are read only once the head has said who sends them, and only up to their route's
limit (console.edge, console.asgi): over a real socket to the real server (console.server), the
answer to an anonymous or oversized request arrives while the client has sent no body, or only
a little more than the limit, and the connection closes after it."""

from __future__ import annotations

import hashlib
import json
import select
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlparse

import pytest
from django.conf import settings
from django.test import Client

from runtime.models import Artifact, Task
from tests import factories
from tests.api.support import read_answer
from tests.conftest import KeptProcesses, Server

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

ARTIFACT_LIMIT = 2 * 1024 * 1024
JSON_LIMIT = settings.DATA_UPLOAD_MAX_MEMORY_SIZE


@pytest.fixture(scope="module")
def artifact_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The artifacts' directory of the module's server, kept across its tests."""
    return tmp_path_factory.mktemp("artifacts")


@pytest.fixture
def web(kept_processes: KeptProcesses, artifact_root: Path, settings: Any) -> Iterator[Server]:
    """The web server (kept for the module, tests.conftest.KeptProcesses) with the routes'
    limits, storing artifacts where this process does."""
    settings.STORAGES = {
        **settings.STORAGES,
        "artifacts": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(artifact_root)},
        },
    }
    yield kept_processes.server(
        ARTIFACT_ROOT=str(artifact_root), ARTIFACT_MAX_BYTES=str(ARTIFACT_LIMIT)
    )
    kept_processes.settle()


def _connect(server: Server) -> socket.socket:
    url = urlparse(server.url)
    return socket.create_connection((url.hostname, url.port), timeout=30)


def _head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: 127.0.0.1",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin1")


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    status, _, headers, body = read_answer(sock)
    return status, headers, body


def _error_code(body: bytes) -> str:
    document = json.loads(body)
    assert set(document) == {"error"} and document["error"]["message"], document
    return str(document["error"]["code"])


def _answered_with_head_only(
    server: Server, method: str, path: str, headers: dict[str, str]
) -> tuple[int, dict[str, str], bytes]:
    """Send a head that announces a body, send none of it, and read the answer."""
    with _connect(server) as sock:
        sock.sendall(_head(method, path, headers))
        return _answer(sock)


def _snapshot() -> tuple[int, int]:
    return Task.objects.count(), Artifact.objects.count()


@pytest.mark.parametrize(
    "framing",
    [{"Transfer-Encoding": "chunked"}, {"Content-Length": str(287 * 1024 * 1024)}],
    ids=["chunked", "287MiB"],
)
def test_an_anonymous_body_is_401_before_any_of_it_is_sent(web, framing):
    before = _snapshot()
    headers = {"Content-Type": "application/json", **framing}
    status, response_headers, body = _answered_with_head_only(web, "POST", "/api/v1/tasks", headers)
    assert status == 401 and _error_code(body) == "not_authenticated"
    assert response_headers["connection"] == "close"
    assert response_headers["www-authenticate"].startswith("Bearer")
    # A token the server does not know is refused the same way, before the body.
    headers["Authorization"] = "Bearer ac_000000000000_unknown"
    status, _, body = _answered_with_head_only(web, "POST", "/api/v1/tasks", headers)
    assert status == 401 and _error_code(body) == "not_authenticated"
    assert _snapshot() == before


def test_an_anonymous_page_form_is_sent_to_the_login_before_its_body(web):
    task = factories.task(factories.agent())
    path = f"/tasks/{task.pk}/cancel"
    headers = {"Content-Type": "application/x-www-form-urlencoded", "Content-Length": "100000000"}
    status, response_headers, _ = _answered_with_head_only(web, "POST", path, headers)
    assert status == 302
    # After the login, back to the form's page (not a GET of the form's URL), told it was not
    # taken (console.web.interrupted).
    back = f"/tasks/{task.pk}/?not_taken={path}"
    assert response_headers["location"] == "/login/?" + urlencode({"next": back}, safe="/")
    assert response_headers["connection"] == "close"
    task.refresh_from_db()
    assert task.cancellation == "none"


def test_a_declared_upload_over_the_limit_is_413_before_its_body(web):
    agent = factories.agent()
    task = factories.task(agent)
    before = _snapshot()
    headers = {
        "Authorization": f"Bearer {agent.token}",
        "Content-Type": "multipart/form-data; boundary=b",
        "Content-Length": str(50 * 1024 * 1024),
    }
    status, response_headers, body = _answered_with_head_only(
        web, "POST", f"/api/v1/tasks/{task.pk}/artifacts", headers
    )
    assert status == 413 and _error_code(body) == "artifact_too_large"
    assert response_headers["connection"] == "close"
    assert _snapshot() == before


def test_a_declared_json_body_over_the_limit_is_413_before_it_is_sent(web):
    agent = factories.agent()
    before = _snapshot()
    headers = {
        "Authorization": f"Bearer {agent.token}",
        "Content-Type": "application/json",
        "Content-Length": str(JSON_LIMIT + 1),
    }
    status, _, body = _answered_with_head_only(web, "POST", "/api/v1/tasks", headers)
    assert status == 413 and _error_code(body) == "request_too_large"
    assert _snapshot() == before


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _readable(sock: socket.socket, timeout: float) -> bool:
    return bool(select.select([sock], [], [], timeout)[0])


def _send_until_answered(sock: socket.socket, total: int, piece: int, threshold: int) -> int:
    """Send chunks of ``piece`` bytes, up to ``total``, never the body's end. Between chunks,
    look (without waiting) whether the server answered; once more than ``threshold`` bytes are
    out, wait for the answer instead of sending more. Returns the body bytes sent."""
    sent = 0
    while sent < total:
        if sent > threshold:
            _readable(sock, 30)
            break  # answered past the limit, or never (the caller's read fails)
        if _readable(sock, 0):
            break
        try:
            sock.sendall(_chunk(b"x" * piece))
        except (BrokenPipeError, ConnectionResetError):
            break  # closed after its answer
        sent += piece
    return sent


def test_a_chunked_json_body_is_cut_off_with_413_once_past_the_limit(web):
    agent = factories.agent()
    before = _snapshot()
    headers = {
        "Authorization": f"Bearer {agent.token}",
        "Content-Type": "application/json",
        "Transfer-Encoding": "chunked",
    }
    total = JSON_LIMIT + 1024 * 1024
    with _connect(web) as sock:
        sock.sendall(_head("POST", "/api/v1/tasks", headers))
        sent = _send_until_answered(sock, total, 64 * 1024, JSON_LIMIT)
        status, response_headers, body = _answer(sock)
    assert status == 413 and _error_code(body) == "request_too_large"
    assert response_headers["connection"] == "close"
    # Answered with at most one piece (and what the kernel held) past the limit, not the rest.
    assert sent < total
    assert _snapshot() == before


def test_a_chunked_multipart_upload_within_the_limit_is_parsed(web):
    agent = factories.agent()
    task = factories.task(agent)
    content = json.dumps({"rows": list(range(20_000))}).encode()
    body = (
        b"--b\r\n"
        b'Content-Disposition: form-data; name="name"\r\n\r\nreport.json\r\n'
        b"--b\r\n"
        b'Content-Disposition: form-data; name="media_type"\r\n\r\napplication/json\r\n'
        b"--b\r\n"
        b'Content-Disposition: form-data; name="file"; filename="r.json"\r\n'
        b"Content-Type: application/json\r\n\r\n" + content + b"\r\n--b--\r\n"
    )
    headers = {
        "Authorization": f"Bearer {agent.token}",
        "Content-Type": "multipart/form-data; boundary=b",
        "Transfer-Encoding": "chunked",
        "Connection": "close",
    }
    with _connect(web) as sock:
        sock.sendall(_head("POST", f"/api/v1/tasks/{task.pk}/artifacts", headers))
        for start in range(0, len(body), 10_000):
            sock.sendall(_chunk(body[start : start + 10_000]))
        sock.sendall(b"0\r\n\r\n")
        status, _, raw = _answer(sock)
    assert status == 201, raw[:300]
    expected = "sha256:" + hashlib.sha256(content).hexdigest()
    assert json.loads(raw)["digest"] == expected
    artifact = Artifact.objects.get(task=task)
    assert (artifact.digest, artifact.size) == (expected, len(content))


def test_a_session_form_over_the_limit_is_413_and_a_small_one_is_served(web):
    admin = factories.console_user("admin")
    task = factories.task(factories.agent())
    client = Client()
    assert client.login(username=admin.actor.name, password=factories.PASSWORD)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    path = f"/tasks/{task.pk}/cancel"
    headers = {
        "Cookie": cookie,
        "Content-Type": "application/x-www-form-urlencoded",
        "Content-Length": str(JSON_LIMIT + 1),
    }
    status, response_headers, page = _answered_with_head_only(web, "POST", path, headers)
    assert status == 413 and b"request_too_large" in page
    assert response_headers["connection"] == "close"
    # Known from its cookie, a small form reaches the view (which wants its CSRF token: without
    # it, nothing is done and the person is sent back to the task's page).
    form = b"reason=stop"
    headers["Content-Length"] = str(len(form))
    headers["Connection"] = "close"
    with _connect(web) as sock:
        sock.sendall(_head("POST", path, headers) + form)
        status, answered, _ = _answer(sock)
    assert (status, answered["location"]) == (303, f"/tasks/{task.pk}/")
    task.refresh_from_db()
    assert task.cancellation == "none"


def test_logging_in_reads_its_chunked_form_without_a_principal(web):
    # Logging in is a public route: its small body is read, chunked too (a multipart form was
    # parsed as empty without a Content-Length).
    factories.console_user("admin", username="alice")
    with urllib.request.urlopen(f"{web.url}/login/", timeout=30) as page:
        cookie = page.headers["Set-Cookie"].split(";")[0]
    csrf = cookie.split("=", 1)[1]
    fields = {"username": "alice", "password": factories.PASSWORD, "csrfmiddlewaretoken": csrf}
    form = b"".join(
        b'--b\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n'
        % (name.encode(), value.encode())
        for name, value in fields.items()
    )
    form += b"--b--\r\n"
    headers = {
        "Cookie": cookie,
        "Content-Type": "multipart/form-data; boundary=b",
        "Transfer-Encoding": "chunked",
        "Connection": "close",
    }
    with _connect(web) as sock:
        sock.sendall(_head("POST", "/login/", headers) + _chunk(form) + b"0\r\n\r\n")
        status, response_headers, _ = _answer(sock)
    assert status == 302 and response_headers["location"] == "/"
    assert "sessionid=" in response_headers.get("set-cookie", "")

"""The web server's own answers, over a real socket to the real server (console.server): what
a client can provoke before or around the application is still the contract's error body, with
a correct reason phrase, and a head too large is 431 rather than a dropped connection."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from django.test import Client

from runtime.models import Task
from tests import factories
from tests.api.support import raw_http, request_bytes
from tests.conftest import ROOT, Server, free_port, service_env, wait_for

pytestmark = pytest.mark.postgres


def _error(status: int, reason: str, headers: dict[str, str], body: bytes) -> dict[str, str]:
    assert headers.get("content-type", "").startswith("application/json"), (status, headers)
    document = json.loads(body)
    assert set(document) == {"error"}, document
    assert document["error"]["code"] and document["error"]["message"], document
    return dict(document["error"])


@pytest.mark.parametrize("chunks", [1, 40], ids=["one-write", "trickled"])
def test_a_100_kb_header_is_431_in_the_error_format(server, chunks):
    data = request_bytes("GET", "/healthz", headers={"X-Big": "a" * 100_000})
    status, reason, headers, body = raw_http(server.url, data, chunks=chunks)
    assert (status, reason) == (431, "Request Header Fields Too Large")
    assert _error(status, reason, headers, body)["code"] == "request_header_too_large"


def test_headers_under_the_limit_are_served(server):
    data = request_bytes("GET", "/healthz", headers={"X-Big": "a" * 8_000})
    status, _, _, body = raw_http(server.url, data)
    assert status == 200 and json.loads(body)["database"] == "ok"


@pytest.mark.parametrize(
    "data",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header\r\n\r\n",
        b"GET /\x01 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"POST /api/v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: x\r\n\r\n",
    ],
    ids=["request-line", "header-line", "control-char", "content-length"],
)
def test_an_unparseable_request_is_400_in_the_error_format(server, data):
    status, reason, headers, body = raw_http(server.url, data)
    assert (status, reason) == (400, "Bad Request")
    assert _error(status, reason, headers, body)["code"] == "malformed_request"


def test_a_malformed_multipart_body_to_the_api_is_415_and_creates_nothing(server):
    token = factories.agent().token
    body = b'--b\r\nContent-Disposition: form-data; name="name"\r\n\r\nunterminated'
    data = request_bytes(
        "POST",
        "/api/v1/tasks",
        body,
        {"Authorization": f"Bearer {token}", "Content-Type": "multipart/form-data; boundary=b"},
    )
    status, reason, headers, raw = raw_http(server.url, data)
    assert (status, reason) == (415, "Unsupported Media Type")
    assert _error(status, reason, headers, raw)["code"] == "unsupported_media_type"
    assert not Task.objects.exists()


@pytest.mark.parametrize("path", ["/login/", "/unresolved/op_x/resolve", "/tasks/t_x/cancel"])
@pytest.mark.parametrize(
    "content_type",
    ["multipart/form-data", "multipart/form-data; boundary=", "multipart/form-data; boundary=\x7f"],
    ids=["no-boundary", "empty-boundary", "bad-boundary"],
)
def test_a_malformed_multipart_form_to_a_page_is_a_400_page(server, path, content_type):
    # Django lets a malformed multipart body escape from the CSRF check as a 500; the edge
    # middleware reads the form first and answers 400.
    body = b'--b\r\nContent-Disposition: form-data; name="x"\r\n\r\nv\r\n--b--\r\n'
    headers = {"Content-Type": content_type}
    if path != "/login/":
        # Anonymous, a page other than the login's is sent to the login before its body is read.
        status, _, sent, _ = raw_http(server.url, request_bytes("POST", path, body, headers))
        assert status == 302 and sent["location"].startswith("/login/")
        client = Client()
        assert client.login(
            username=factories.console_user("admin").actor.name, password=factories.PASSWORD
        )
        headers["Cookie"] = f"sessionid={client.cookies['sessionid'].value}"
    data = request_bytes("POST", path, body, headers)
    status, reason, headers, raw = raw_http(server.url, data)
    assert (status, reason) == (400, "Bad Request"), raw[:300]
    assert headers["content-type"].startswith("text/html")
    assert b"malformed" in raw


def test_a_csrf_refusal_sends_the_person_back_to_the_form_s_page(server):
    # A form without its CSRF cookie changes nothing and brings the person back to the page it
    # was on with a message (console/web/interrupted.py), never Django's own 403 page (inline
    # style, which the CSP would block) nor a bare refusal.
    data = request_bytes(
        "POST",
        "/login/",
        b"username=a&password=b",
        {"Content-Type": "application/x-www-form-urlencoded"},
    )
    status, reason, headers, raw = raw_http(server.url, data)
    assert (status, reason) == (303, "See Other"), raw[:300]
    assert headers["location"].startswith("/login/")
    assert b"<style>" not in raw


def test_422_has_its_reason_phrase_and_the_error_body(server):
    token = factories.agent().token
    first, second = b'{"name": "one"}', b'{"name": "two"}'
    for body, expected in ((first, 201), (second, 422)):
        data = request_bytes(
            "POST",
            "/api/v1/tasks",
            body,
            {
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                "Idempotency-Key": "same-key",
            },
        )
        status, reason, headers, raw = raw_http(server.url, data)
        assert status == expected, raw
    assert reason == "Unprocessable Entity"
    assert _error(status, reason, headers, raw)["code"] == "idempotency_key_reused"
    assert Task.objects.count() == 1


def test_a_malformed_websocket_handshake_is_400_in_the_error_format(server):
    data = request_bytes(
        "GET", "/ws/feed/", headers={"Upgrade": "websocket", "Connection": "Upgrade"}
    )
    status, reason, headers, body = raw_http(
        server.url, data.replace(b"Connection: close\r\n", b"")
    )
    assert (status, reason) == (400, "Bad Request")
    _error(status, reason, headers, body)


def test_an_unknown_api_path_is_404_in_the_error_format(server):
    status, reason, headers, body = raw_http(server.url, request_bytes("GET", "/api/v1/nope"))
    assert (status, reason) == (404, "Not Found")
    assert _error(status, reason, headers, body)["code"] == "not_found"


def test_the_web_server_serves_requests_from_a_pool_of_database_connections(server):
    """ASGI runs each request's sync code in a thread of its own, where Django's persistent
    connection is never reused: without the pool every request opened (and soon dropped) a
    PostgreSQL backend of its own. With it, the web server's backends stay open between requests
    and a run of requests is served by the few it has."""
    import urllib.request

    from django.db import connection

    owner = factories.agent()

    def get() -> None:
        request = urllib.request.Request(f"{server.url}/api/v1/tasks", headers=owner.headers)
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200

    def web_backends() -> list[tuple[int, object]]:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT pid, backend_start FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = %s",
                ["agent-console-web"],
            )
            return list(cur.fetchall())

    get()
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        since = cur.fetchone()[0]
    for _ in range(20):
        get()
    backends = web_backends()
    assert backends, "the web server keeps no pooled connection"
    # A request may start before the last one handed its connection back, so the pool can grow
    # by one or two; never by one backend per request.
    assert len([pid for pid, started in backends if started > since]) <= 5, backends


def test_more_open_event_streams_than_pooled_connections_leave_requests_served(
    transactional_db, tmp_path
):
    """A server-sent event stream hands its database connection back between reads: with a
    pool of two, four open streams still leave room for an ordinary request, and each stream
    still delivers a new event."""
    import http.client
    from urllib.parse import urlparse

    from runtime.specs import OperationSpec
    from runtime.transitions.propose import operation_propose
    from tests.conftest import server_start

    server = server_start(tmp_path, DB_POOL_MAX=2)
    owner = factories.agent()
    task = factories.task(owner)
    address = urlparse(server.url)
    streams = []
    try:
        for _ in range(4):
            conn = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
            conn.request(
                "GET",
                f"/api/v1/tasks/{task.pk}/events?max_seconds=60",
                headers={**owner.headers, "Accept": "text/event-stream"},
            )
            response = conn.getresponse()
            assert response.status == 200
            streams.append((conn, response))

        plain = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
        plain.request("GET", "/api/v1/tasks", headers=owner.headers)
        answer = plain.getresponse()
        assert answer.status == 200, answer.read()[:500]
        plain.close()

        operation_propose(
            owner.actor, task.pk, OperationSpec(tool="demo.echo", step="s", params={"v": 1})
        )
        for _, response in streams:
            seen = b""
            while b"operation.proposed" not in seen:
                line = response.fp.readline()
                assert line, f"the stream ended before the event: {seen[-500:]!r}"
                seen += line
    finally:
        for conn, _ in streams:
            conn.close()
        server.stop()


def test_several_server_processes_serve_from_pooled_connections(transactional_db, tmp_path):
    """WEB_CONCURRENCY=2 serves from two worker processes, and a burst of requests over fresh
    sockets is served from pooled connections (the next test shows each worker process pools)."""
    import threading
    import urllib.request
    from pathlib import Path

    from django.db import connection

    from tests.conftest import server_start

    server = server_start(tmp_path, WEB_CONCURRENCY=2)
    owner = factories.agent()
    try:
        pid = server.proc.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        commands = [Path(f"/proc/{c}/cmdline").read_bytes().replace(b"\0", b" ") for c in children]
        assert len([c for c in commands if b"spawn_main" in c]) == 2, commands
        failures: list[object] = []

        def get() -> None:
            request = urllib.request.Request(f"{server.url}/api/v1/tasks", headers=owner.headers)
            try:
                for _ in range(10):
                    with urllib.request.urlopen(request, timeout=10) as response:
                        assert response.status == 200
            except Exception as exc:  # collected: an assertion in a thread is not seen
                failures.append(exc)

        threads = [threading.Thread(target=get) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, failures
        with connection.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = 'agent-console-web'"
            )
            assert cur.fetchone()[0] >= 1
    finally:
        server.stop()


def test_a_server_worker_process_pools_its_connections():
    """What a web worker process does when it starts: it loads the settings afresh, with the
    server's mark (CONSOLE_WEB_SERVER) in its environment, and pools its connections; a
    process without the mark (a Celery worker) keeps its one persistent connection."""
    import subprocess
    import sys

    from tests.conftest import ROOT, service_env

    show = (
        "import django; django.setup(); from django.conf import settings; "
        "d = settings.DATABASES['default']; "
        "print(d['ENGINE'], d['CONN_MAX_AGE'], d['OPTIONS'].get('pool', {}).get('max_size'))"
    )

    def loaded(**env: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", show],
            cwd=ROOT,
            env=service_env(**env),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return " ".join(done.stdout.split()[-3:])

    # The pool checks a connection by its socket (console.pgpool).
    assert loaded(CONSOLE_WEB_SERVER="1", DB_POOL_MAX="7") == "console.pgpool 0 7"
    # service_env's CONN_MAX_AGE=0; no pool
    assert loaded() == "django.db.backends.postgresql 0 None"


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _unchunked(headers: dict[str, str], body: bytes) -> bytes:
    """The body of a chunked answer (Django's answer to a Host it refuses has no length)."""
    if headers.get("transfer-encoding") != "chunked":
        return body
    whole = b""
    while True:
        size, _, body = body.partition(b"\r\n")
        if int(size, 16) == 0:
            return whole
        whole, body = whole + body[: int(size, 16)], body[int(size, 16) + 2 :]


def _port(server_url: str) -> int:
    return int(server_url.rsplit(":", 1)[1])


def _target(target: str, headers: dict[str, str] | None = None) -> bytes:
    """GET with ``target`` as the request-target, byte for byte (request_bytes takes a path)."""
    lines = [f"GET {target} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin1")


def test_an_absolute_form_target_is_routed_by_its_path_and_host(server):
    """RFC 9112 3.2.2: a server accepts ``GET http://host/path``, and the target's host stands
    in for the Host header. uvicorn passed the whole URL on as the path, which named no route:
    an API URL got a page's 404 in HTML."""
    owner = factories.agent()
    port = _port(server.url)
    status, reason, headers, body = raw_http(
        server.url, _target(f"http://127.0.0.1:{port}/api/v1/nope?x=1", owner.headers)
    )
    assert (status, reason) == (404, "Not Found")
    assert _error(status, reason, headers, body)["code"] == "not_found"
    # Served by its route, as its path says.
    status, _, headers, body = raw_http(
        server.url, _target(f"http://127.0.0.1:{port}/api/v1/tasks", owner.headers)
    )
    assert status == 200 and json.loads(body)["results"] == [], body[:300]
    # The host the target names is the one judged (Host: 127.0.0.1 is ignored): refused.
    status, reason, headers, body = raw_http(
        server.url, _target("http://evil.example/api/v1/tasks", owner.headers)
    )
    assert (status, reason) == (400, "Bad Request")
    _error(status, reason, headers, _unchunked(headers, body))


@pytest.mark.parametrize(
    "line",
    [
        "OPTIONS * HTTP/1.1",
        "CONNECT 127.0.0.1:80 HTTP/1.1",
        "GET ftp://127.0.0.1/api/v1/tasks HTTP/1.1",
    ],
    ids=["asterisk", "authority", "not-http-url"],
)
def test_a_target_that_is_not_a_path_is_400_in_the_error_format(server, line):
    """They were answered as an unknown page: a 404 in HTML."""
    data = f"{line}\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
    status, reason, headers, body = raw_http(server.url, data)
    assert (status, reason) == (400, "Bad Request")
    assert _error(status, reason, headers, body)["code"] == "malformed_request"


def test_a_failure_before_django_answers_is_a_500_in_the_error_format(tmp_path):
    """A request with a body has its principal looked up from its head before Django's
    handler runs (console.edge): with the database away that lookup fails, and uvicorn
    answered the exception itself, in text/plain. Django's own 500 (a request without a body)
    was already the contract's."""
    port = free_port()
    log = tmp_path / "web.log"
    env = service_env(DATABASE_URL=f"postgres://postgres@127.0.0.1:{free_port()}/nowhere")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "console.server", "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Server(f"http://127.0.0.1:{port}", proc, log)
    try:
        wait_for(
            lambda: _listening(port),
            timeout=60,
            what=f"the server to listen:\n{log.read_text()[-3000:]}",
        )
        token = {"Authorization": "Bearer ac_000000000000_" + "x" * 43}
        data = request_bytes("POST", "/api/v1/tasks", b'{"name": "x"}', token)
        status, reason, headers, body = raw_http(server.url, data)
        assert (status, reason) == (500, "Internal Server Error"), body[:300]
        assert _error(status, reason, headers, body)["code"] == "internal_error"
    finally:
        server.stop()
    assert "request failed before its answer: POST /api/v1/tasks" in log.read_text()

"""HTTP tools declared without code, called by real worker processes (issue 36 point 2): a local
receiver (a ThreadingHTTPServer on 127.0.0.1; TOOL_ALLOW_PRIVATE_HOSTS=1 lets the workers reach
it) answers each outcome class, and the operations end as the contract says:

- 2xx: succeeded, the JSON body its result;
- 4xx: failed (permanent), called once;
- 503 then 429 then 2xx: retried, then succeeded, the receiver seeing one key across the calls;
- a refused connection: transient, retried until the receiver is up;
- a timeout after the request was sent: unknown, so contract none ends ``unresolved`` for a
  person with the request as the invocation's evidence, and contract lookup asks the receiver.

Every call carries the operation's key in the declared header, the lease generation as the
fencing token and the sealed credential. The tools are declared after the workers started (they
read the declarations when they meet them); an edit made while a call is out makes a new
version, and the operation keeps the version it was recorded under."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from runtime.models import Invocation, Operation
from runtime.tool_declarations import tool_declare, tool_edit
from runtime.tools.declared import declarations_forget
from tests import factories
from tests.conftest import free_port, wait_for

pytestmark = [pytest.mark.workers, pytest.mark.postgres]

FAST = {
    "SWEEP_SECONDS": 1,
    "OUTBOX_GRACE_SECONDS": 2,
    "RETRY_BASE_SECONDS": 0.2,
    "RETRY_CAP_SECONDS": 0.5,
    "TOOL_ALLOW_PRIVATE_HOSTS": "1",
}
SECRET = "receiver-api-key"
KEY_HEADER = "X-Request-Key"


@dataclass
class Call:
    path: str
    key: str
    fencing: str
    auth: str
    body: Any


@dataclass
class Receiver:
    """Answers by path; keeps every request; ``hold`` holds the first request of a path until
    released (or a timeout), and ``plan`` answers a path's calls in turn."""

    calls: list[Call] = field(default_factory=list)
    plan: dict[str, list[tuple[int, Any]]] = field(default_factory=dict)
    hold: dict[str, threading.Event] = field(default_factory=dict)
    arrived: dict[str, threading.Event] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    def url(self, path: str) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def of(self, path: str) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.path == path]

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        path = handler.path.split("?", 1)[0]
        call = Call(
            path=path,
            key=handler.headers.get(KEY_HEADER, ""),
            fencing=handler.headers.get("X-Console-Fencing-Token", ""),
            auth=handler.headers.get("Authorization", ""),
            body=json.loads(raw) if raw else None,
        )
        with self.lock:
            self.calls.append(call)
            seen = sum(1 for c in self.calls if c.path == path)
            steps = self.plan.get(path, [(201, None)])
            status, body = steps[min(seen, len(steps)) - 1]
        if path in self.arrived:
            self.arrived[path].set()
        if path in self.hold and seen == 1:
            self.hold[path].wait(30)
        if path.startswith("/find"):
            # The lookup: what was received under this key.
            found = [c for c in self.calls if c.key == call.key and not c.path.startswith("/find")]
            status, body = (200, {"found": found[0].path}) if found else (404, None)
        elif body is None:
            body = {"id": f"c-{seen}", "key": call.key, "params": call.body}
        payload = json.dumps(body).encode()
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
        except OSError:
            pass  # the caller gave up (its timeout)


def _serve(receiver: Receiver, port: int = 0) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            receiver.answer(self)

        def do_GET(self) -> None:
            receiver.answer(self)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    receiver.server = server
    return server


@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    settings.TOOL_ALLOW_PRIVATE_HOSTS = True  # this process declares, the workers call
    declarations_forget()
    found = Receiver()
    server = _serve(found)
    try:
        yield found
    finally:
        for gate in found.hold.values():
            gate.set()
        server.shutdown()
        declarations_forget()


def _declare(admin: Any, name: str, url: str, **fields: Any) -> None:
    tool_declare(
        admin.actor,
        {
            "name": name,
            "kind": "http",
            "contract": fields.pop("contract", "replay"),
            "url": url,
            "idempotency_header": KEY_HEADER,
            "auth": {"type": "bearer", "secret": SECRET},
            "timeout_seconds": fields.pop("timeout_seconds", 5),
            "max_attempts": fields.pop("max_attempts", 8),
            "params_schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
            **fields,
        },
    )


def _settled(op_id: str, worker: Any, statuses: tuple[str, ...]) -> Operation:
    return wait_for(
        lambda: Operation.objects.filter(pk=op_id, status__in=statuses).first(),
        timeout=60,
        what=f"operation {op_id} to reach {statuses}:\n{worker.tail()}",
    )


def test_each_outcome_class_of_an_http_tool_through_real_workers(workers, receiver):
    (worker,) = workers.start(count=1, concurrency=2, **FAST)
    workers.start_beat(**FAST)
    admin = factories.console_user("admin")
    receiver.plan = {
        "/ok": [(201, None)],
        "/reject": [(422, {"error": "the email is not valid"})],
        "/flaky": [(503, {"error": "busy"}), (429, {"error": "slow down"}), (200, None)],
    }
    # Declared after the workers started: they read the declarations when they meet them.
    for path in ("ok", "reject", "flaky"):
        _declare(admin, f"acme.{path}", receiver.url(f"/{path}"))
    owner = factories.agent()
    task = factories.task(owner)
    ops = {
        path: factories.operation(owner, task, tool=f"acme.{path}", params={"n": i})
        for i, path in enumerate(("ok", "reject", "flaky"))
    }

    ok = _settled(ops["ok"].pk, worker, ("succeeded",))
    (call,) = receiver.of("/ok")
    assert ok.result == {"id": "c-1", "key": ok.idempotency_key, "params": {"n": 0}}
    assert call.key == ok.idempotency_key and call.auth == f"Bearer {SECRET}"
    (invocation,) = Invocation.objects.filter(operation=ok)
    assert call.fencing == str(invocation.lease_generation) == str(ok.lease_generation)
    assert invocation.receipt["status"] == 201 and SECRET not in json.dumps(invocation.receipt)

    rejected = _settled(ops["reject"].pk, worker, ("failed",))
    assert rejected.error["kind"] == "permanent" and "422" in rejected.error["message"]
    assert len(receiver.of("/reject")) == 1  # never called again

    flaky = _settled(ops["flaky"].pk, worker, ("succeeded",))
    calls = receiver.of("/flaky")
    assert len(calls) == 3
    # One key for the logical call across its retries; each retry under a newer lease.
    assert {c.key for c in calls} == {flaky.idempotency_key}
    invocations = list(Invocation.objects.filter(operation=flaky).order_by("number"))
    assert [i.outcome for i in invocations] == [
        Invocation.OUTCOME_FAILED_TRANSIENT,
        Invocation.OUTCOME_FAILED_TRANSIENT,
        Invocation.OUTCOME_SUCCEEDED,
    ]
    assert [c.fencing for c in calls] == [str(i.lease_generation) for i in invocations]
    assert len({c.fencing for c in calls}) == 3


def test_a_refused_connection_is_transient_and_the_call_goes_out_once_the_receiver_is_up(
    workers, settings
):
    settings.TOOL_ALLOW_PRIVATE_HOSTS = True
    declarations_forget()
    (worker,) = workers.start(count=1, concurrency=1, **FAST)
    workers.start_beat(**FAST)
    admin = factories.console_user("admin")
    port = free_port()  # nothing listens there yet
    _declare(admin, "acme.later", f"http://127.0.0.1:{port}/later", max_attempts=50)
    owner = factories.agent()
    op = factories.operation(owner, factories.task(owner), tool="acme.later", params={"n": 1})
    wait_for(
        lambda: (
            Invocation.objects.filter(
                operation=op, outcome=Invocation.OUTCOME_FAILED_TRANSIENT
            ).count()
            >= 2
        ),
        timeout=60,
        what=f"refused calls to be retried:\n{worker.tail()}",
    )
    assert Operation.objects.get(pk=op.pk).status in ("retry_scheduled", "pending", "running")
    late = Receiver()
    server = _serve(late, port)
    try:
        done = _settled(op.pk, worker, ("succeeded",))
    finally:
        server.shutdown()
        declarations_forget()
    (call,) = late.of("/later")
    assert call.key == done.idempotency_key


def test_a_timeout_after_the_request_was_sent_goes_to_a_person_for_contract_none(workers, receiver):
    (worker,) = workers.start(count=1, concurrency=1, **FAST)
    workers.start_beat(**FAST)
    admin = factories.console_user("admin")
    receiver.hold["/slow"] = threading.Event()  # answers after the caller's 1 s timeout
    _declare(admin, "acme.slow", receiver.url("/slow"), contract="none", timeout_seconds=1)
    owner = factories.agent()
    op = factories.operation(owner, factories.task(owner), tool="acme.slow", params={"n": 1})

    unresolved = _settled(op.pk, worker, ("unresolved",))
    receiver.hold["/slow"].set()
    (call,) = receiver.of("/slow")  # sent once, and never again: it may have happened
    assert call.key == unresolved.idempotency_key
    (invocation,) = Invocation.objects.filter(operation=unresolved)
    assert invocation.outcome == Invocation.OUTCOME_UNKNOWN
    evidence = invocation.receipt
    assert evidence["idempotency_key"] == unresolved.idempotency_key
    assert evidence["fencing_token"] == invocation.lease_generation
    assert evidence["method"] == "POST" and evidence["tool_version"] == "1"
    assert evidence["endpoint"].startswith("http://127.0.0.1:") and "at" in evidence
    assert "timed out" in evidence["error"]


def test_a_timeout_with_contract_lookup_asks_the_receiver_and_settles_from_its_answer(
    workers, receiver
):
    (worker,) = workers.start(count=1, concurrency=1, **FAST)
    workers.start_beat(**FAST)
    admin = factories.console_user("admin")
    receiver.hold["/made"] = threading.Event()
    _declare(
        admin,
        "acme.made",
        receiver.url("/made"),
        contract="lookup",
        timeout_seconds=1,
        lookup_url=receiver.url("/find"),
    )
    owner = factories.agent()
    op = factories.operation(owner, factories.task(owner), tool="acme.made", params={"n": 1})
    done = _settled(op.pk, worker, ("succeeded",))
    receiver.hold["/made"].set()
    assert done.result == {"found": "/made"}
    assert len(receiver.of("/made")) == 1  # asked, not sent again
    (ask,) = receiver.of("/find")
    assert ask.key == done.idempotency_key


def test_an_edit_while_a_call_is_out_is_a_new_version_and_the_work_keeps_its_own(workers, receiver):
    (worker,) = workers.start(count=1, concurrency=2, **FAST)
    workers.start_beat(**FAST)
    admin = factories.console_user("admin")
    receiver.plan = {"/v1": [(503, {"error": "busy"}), (200, None)], "/v2": [(200, None)]}
    receiver.hold["/v1"] = threading.Event()
    receiver.arrived["/v1"] = threading.Event()
    _declare(admin, "acme.moving", receiver.url("/v1"))
    owner = factories.agent()
    task = factories.task(owner)
    first = factories.operation(owner, task, tool="acme.moving", params={"n": 1})
    assert receiver.arrived["/v1"].wait(60), worker.tail()

    # Edited while the first call is out (its answer will be 503: it will be retried).
    edited = tool_edit(admin.actor, "acme.moving", {"url": receiver.url("/v2")}, version=1)
    assert edited.row.version == 2
    second = factories.operation(owner, task, tool="acme.moving", params={"n": 2})
    receiver.hold["/v1"].set()

    first_done = _settled(first.pk, worker, ("succeeded",))
    second_done = _settled(second.pk, worker, ("succeeded",))
    assert (first_done.tool_version, second_done.tool_version) == ("1", "2")
    # The retry of the first went where version 1 says, under the same key.
    assert [c.key for c in receiver.of("/v1")] == [first.idempotency_key] * 2
    assert [c.key for c in receiver.of("/v2")] == [second.idempotency_key]

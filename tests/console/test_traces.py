"""Traces (issue 40 point 3, docs/operations.md#traces): an agent's ``traceparent`` is continued
through the proposal (the request), the outbox (its row and its message, also when the sweeper
sends a lost message again), the claim, the tool call (the HTTP tool's request carries it) and
the acceptance, all spans of the agent's trace with the operation's and task's ids; with
tracing off nothing of OpenTelemetry's SDK or instrumentations is loaded and no trace context
is stored."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator
from django.conf import settings as django_settings
from django.db import connections, transaction
from django.utils import timezone
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from console import asgi
from console.tracing import tracing_start, tracing_stop, tracing_wanted
from runtime import executor, outbox, tracing
from runtime.drainers import Registration, queue_of
from runtime.executor import operation_execute
from runtime.models import Operation, OutboxMessage
from runtime.outbox import TOPIC_EXECUTE, outbox_enqueue_txn, outbox_sweep, outbox_traces
from runtime.publish import EXECUTE_OPERATION, message_now
from runtime.tool_declarations import tool_declare
from runtime.tools.declared import declarations_forget
from tests import factories

ROOT = Path(__file__).resolve().parents[2]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process, its spans kept in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing_start(provider)
    try:
        yield exporter
    finally:
        tracing_stop()
        provider.shutdown()


@pytest.fixture
def receiver(settings: Any) -> Iterator[list[dict[str, str]]]:
    """A local HTTP receiver keeping each request's headers."""
    settings.TOOL_ALLOW_PRIVATE_HOSTS = True
    declarations_forget()
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append({k.lower(): v for k, v in self.headers.items()})
            body = b'{"ok": true}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    seen_url = f"http://127.0.0.1:{server.server_address[1]}/charge"
    settings.TRACES_TEST_URL = seen_url
    try:
        yield seen
    finally:
        server.shutdown()
        declarations_forget()


def _queues() -> redis.Redis:
    return redis.Redis.from_url(str(django_settings.REDIS_URL))


def _queued_headers() -> list[dict[str, Any]]:
    """The headers of every message waiting in the operations queue (Celery's task messages)."""
    raw = _queues().lrange(django_settings.CELERY_QUEUE, 0, -1)
    return [json.loads(m)["headers"] for m in raw]


def _empty_queues() -> None:
    client = _queues()
    for queue in django_settings.CELERY_QUEUES:
        client.delete(queue, f"drain:{queue}", f"drain1:{queue}", f"drainers:{queue}")
    outbox._drained_at.clear()


def _trace_of(header: str) -> str:
    return header.split("-")[1]


def _by_name(exporter: InMemorySpanExporter) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for span in exporter.get_finished_spans():
        found.setdefault(span.name, []).append(span)
    return found


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_agents_trace_runs_from_the_request_to_the_tool_call_and_its_acceptance(
    spans, receiver, settings
):
    _empty_queues()
    admin = factories.console_user("admin")
    tool_declare(
        admin.actor,
        {
            "name": "acme.charge",
            "kind": "http",
            "contract": "replay",
            "url": settings.TRACES_TEST_URL,
            "timeout_seconds": 5,
            "params_schema": {"type": "object"},
        },
    )
    owner = factories.agent()
    task = factories.task(owner)
    response = owner.client().post(
        f"/api/v1/tasks/{task.pk}/operations",
        {"tool": "acme.charge", "step": "charge", "params": {"amount": 5}},
        format="json",
        HTTP_TRACEPARENT=TRACEPARENT,
    )
    assert response.status_code in (200, 201), response.content
    op = Operation.objects.get(pk=response.json()["id"])

    # The outbox row keeps the trace, and the message sent after the commit carries it.
    (row,) = OutboxMessage.objects.filter(operation=op)
    assert _trace_of(row.payload["traceparent"]) == TRACE_ID
    (sent,) = _queued_headers()
    assert _trace_of(sent["traceparent"]) == TRACE_ID

    # The message is lost (Redis emptied): the sweeper sends it again, in the same trace.
    _empty_queues()
    assert outbox_sweep(now=timezone.now() + timedelta(seconds=settings.OUTBOX_GRACE_SECONDS + 1))
    (resent,) = _queued_headers()
    assert _trace_of(resent["traceparent"]) == TRACE_ID
    _empty_queues()

    # The worker's path, in this process: no message context, so the row's is continued.
    assert operation_execute(op.pk) == "succeeded"

    named = _by_name(spans)
    for name in ("operation.propose", "operation.claim", "operation.tool_call", "operation.accept"):
        (span,) = named[name]
        assert format(span.context.trace_id, "032x") == TRACE_ID, name
        assert span.attributes["console.operation_id"] == op.pk, name
        assert span.attributes["console.task_id"] == task.pk, name
    # The request's own span (Django's instrumentation) continued the agent's traceparent and
    # is the proposal's parent.
    (server,) = [s for s in spans.get_finished_spans() if s.kind.name == "SERVER"]
    assert format(server.context.trace_id, "032x") == TRACE_ID
    assert named["operation.propose"][0].parent.span_id == server.context.span_id
    assert named["operation.accept"][0].attributes["console.outcome"] == "succeeded"
    # The receiver got the trace, as a child of the tool call's span.
    (call,) = receiver
    tool_call = named["operation.tool_call"][0]
    assert call["traceparent"].split("-")[1:3] == [
        TRACE_ID,
        format(tool_call.context.span_id, "016x"),
    ]


@pytest.mark.django_db(transaction=True)
def test_a_request_through_the_asgi_handler_continues_the_agents_trace(spans):
    # As the server runs it (console.asgi's handler, whose chain is built after startup's
    # instrumentation): Django's instrumentation reads the traceparent from the ASGI scope.
    owner = factories.agent()
    app = asgi.SyncChainASGIHandler()
    headers = [
        (b"host", b"testserver"),
        (b"authorization", f"Bearer {owner.token}".encode()),
        (b"traceparent", TRACEPARENT.encode()),
    ]

    async def get() -> dict[str, Any]:
        comm = HttpCommunicator(app, "GET", "/api/v1/tasks", headers=headers)
        return await comm.get_response(10)  # type: ignore[no-any-return]

    try:
        assert async_to_sync(get)()["status"] == 200
    finally:
        for idle in list(asgi._threads._free):
            idle.submit(connections.close_all).result(timeout=10)
    (server,) = [s for s in spans.get_finished_spans() if s.kind.name == "SERVER"]
    assert format(server.context.trace_id, "032x") == TRACE_ID
    assert server.parent is not None and format(server.parent.span_id, "016x") == "00f067aa0ba902b7"


def test_the_switch_follows_the_standard_environment(monkeypatch, settings):
    for name in (
        "OTEL_TRACES_EXPORTER",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_SDK_DISABLED",
    ):
        monkeypatch.delenv(name, raising=False)
    settings.OTEL_ENABLED = False
    assert not tracing_wanted()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert tracing_wanted()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert not tracing_wanted()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    assert tracing_wanted()
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not tracing_wanted()
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    monkeypatch.delenv("OTEL_TRACES_EXPORTER")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    settings.OTEL_ENABLED = True
    assert tracing_wanted()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_calls_a_drainer_takes_continue_each_their_own_trace(spans):
    # A drainer's calls come with no message: each one's tool call continues the trace its
    # announcement kept (one read for the batch, before the claim spends the rows).
    _empty_queues()
    owner = factories.agent()
    task = factories.task(owner)
    registration = Registration(queue_of("demo.echo"))
    assert registration.renew()
    traces = {}
    try:
        for step in ("a", "b"):
            with tracing.span("agent.step") as current:
                op = factories.operation(owner, task, step=step, tool="demo.echo")
            traces[op.pk] = format(current.get_span_context().trace_id, "032x")
    finally:
        registration.leave()
    assert executor.queue_drain(django_settings.CELERY_QUEUE, asked=True) == 2
    calls = _by_name(spans)["operation.tool_call"]
    assert {
        s.attributes["console.operation_id"]: format(s.context.trace_id, "032x") for s in calls
    } == traces
    assert len(set(traces.values())) == 2
    _empty_queues()


@pytest.mark.django_db
def test_an_announcement_written_by_the_general_writers_keeps_the_trace(spans):
    # The ORM's announcement (the general writers, the embedded mode, a retry scheduled by the
    # sweeper's takeover) keeps the context current where it is written, as the statements do.
    owner = factories.agent()
    op = factories.operation(owner, factories.task(owner))
    with tracing.span("operation.release") as current, transaction.atomic():
        row = outbox_enqueue_txn(topic=TOPIC_EXECUTE, operation_id=op.pk, now=timezone.now())
    stored = OutboxMessage.objects.get(pk=row.pk).payload
    assert stored["traceparent"].split("-")[1:3] == [
        format(current.get_span_context().trace_id, "032x"),
        format(current.get_span_context().span_id, "016x"),
    ]
    # The latest announcement's, as a delivery reads it.
    assert outbox_traces([op.pk]) == {op.pk: stored}


@pytest.mark.django_db
def test_with_tracing_off_nothing_is_stored_and_helpers_do_nothing():
    assert not tracing.tracing_enabled()
    owner = factories.agent()
    op = factories.operation(owner, factories.task(owner))
    (row,) = OutboxMessage.objects.filter(operation=op)
    assert row.payload == {}
    assert tracing.carrier() == {}
    with tracing.span("operation.claim", operation_id=op.pk) as current:
        assert current is None


_STARTUP = """
import json, sys
import django
django.setup()
import console.asgi, console.celery
from django.conf import settings
loaded = ("opentelemetry.instrumentation", "opentelemetry.sdk.trace")
print(json.dumps({
    "modules": sorted(m for m in sys.modules if m.startswith(loaded)),
    "middleware": [m for m in settings.MIDDLEWARE if "opentelemetry" in m],
}))
"""


def _startup(**env: str) -> dict[str, Any]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTEST_"))}
    out = subprocess.run(
        [sys.executable, "-c", _STARTUP],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "console.settings", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_process_with_tracing_off_loads_no_instrumentation_and_one_with_it_on_does():
    off = _startup()
    assert off == {"modules": [], "middleware": []}
    on = _startup(OTEL_TRACES_EXPORTER="console")
    assert any(m.startswith("opentelemetry.instrumentation.django") for m in on["modules"])
    assert any(m.startswith("opentelemetry.instrumentation.celery") for m in on["modules"])
    assert on["middleware"], "Django's instrumentation adds its middleware"


def test_the_message_pushed_directly_carries_the_trace_celery_reads(spans):
    # runtime.publish.message_now builds the message the hot path pushes itself: its headers
    # carry the trace where Celery's instrumentation reads it on the worker's side.
    found = message_now(EXECUTE_OPERATION, "op-1", 1, trace={"traceparent": TRACEPARENT})
    if django_settings.EMBEDDED_BROKER:
        # The embedded broker has no direct push: every message goes through Celery's
        # publish, whose instrumentation carries the trace (the tests above).
        assert found is None
        return
    assert found is not None
    _, payload = found
    message = json.loads(payload)
    assert message["headers"]["traceparent"] == TRACEPARENT
    assert json.loads(base64.b64decode(message["body"]))[0] == ["op-1", 1]

"""Traces through a real Celery worker (issue 40 point 3): the web side in this process (its
spans in memory), a worker process exporting by the standard environment (OTLP over HTTP to a
collector this test runs), and an HTTP tool's receiver. The worker continues the agent's trace
from the message's headers (Celery's instrumentation), in a prefork child, with the tool's call
made in one of its slots (another thread), and the receiver sees the tool call's span as the
parent."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from runtime.models import Operation
from runtime.tool_declarations import tool_declare
from tests import factories
from tests.conftest import wait_for
from tests.console.test_traces import TRACE_ID, TRACEPARENT, receiver, spans

pytestmark = [pytest.mark.workers, pytest.mark.postgres]

__all__ = ["receiver", "spans"]  # fixtures shared with test_traces


@dataclass
class Collector:
    """An OTLP/HTTP endpoint keeping every span it is sent (name, trace id, attributes)."""

    spans: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def keep(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        with self.lock:
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        self.spans.append(
                            {
                                "name": span.name,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "attributes": {
                                    a.key: a.value.string_value or a.value.int_value
                                    for a in span.attributes
                                },
                            }
                        )

    def named(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["name"] == name]


@pytest.fixture
def collector() -> Iterator[tuple[Collector, str]]:
    found = Collector()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            found.keep(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield found, f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    finally:
        server.shutdown()


def test_a_real_worker_continues_the_agents_trace_to_the_tool_call(
    workers, spans, receiver, collector, settings
):
    found, endpoint = collector
    (worker,) = workers.start(
        count=1,
        concurrency=1,
        TOOL_ALLOW_PRIVATE_HOSTS="1",
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=endpoint,
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
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
    op_id = response.json()["id"]
    wait_for(
        lambda: Operation.objects.filter(pk=op_id, status="succeeded").exists(),
        timeout=60,
        what=f"the operation to succeed:\n{worker.tail()}",
    )
    wait_for(
        lambda: found.named("operation.accept"),
        timeout=30,
        what=f"the worker's spans at the collector:\n{worker.tail()}",
    )
    (proposal,) = [s for s in spans.get_finished_spans() if s.name == "operation.propose"]
    assert format(proposal.context.trace_id, "032x") == TRACE_ID
    for name in ("operation.claim", "operation.tool_call", "operation.accept"):
        (span,) = found.named(name)
        assert span["trace_id"] == TRACE_ID, name
        assert span["attributes"]["console.operation_id"] == op_id, name
    (run,) = [s for s in found.spans if s["name"].startswith("run/")]
    assert run["trace_id"] == TRACE_ID  # Celery's own span, from the message's headers
    statements = [s for s in found.spans if s["name"] in ("SELECT", "INSERT", "UPDATE", "WITH")]
    assert any(s["trace_id"] == TRACE_ID for s in statements)  # psycopg's, in the same trace
    (call,) = receiver
    assert call["traceparent"].split("-")[1:3] == [
        TRACE_ID,
        found.named("operation.tool_call")[0]["span_id"],
    ]

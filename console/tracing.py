"""Traces with OpenTelemetry (docs/operations.md#traces), set up at startup (console.apps) in
every process: the web, the workers, beat.

Off unless asked for: the ``OTEL_ENABLED`` setting, or the standard environment naming a trace
exporter (``OTEL_TRACES_EXPORTER``, not ``none``) or an OTLP endpoint; ``OTEL_SDK_DISABLED=true``
wins. Off, nothing of OpenTelemetry's SDK or instrumentations is imported and the runtime's
helpers (runtime.tracing) do nothing. On, the SDK configures itself from the standard
``OTEL_*`` variables (the distro's configurator: exporter, endpoint, protocol, sampler, resource
and service name), then OpenTelemetry's maintained instrumentations are applied: Django (the
request's span, continuing the agent's ``traceparent``), Celery (the message carries the trace
to the worker), psycopg and httpx; and the runtime makes its spans (the proposal, the claim, the
tool call, the acceptance) with the same provider."""

from __future__ import annotations

import importlib
import os
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from runtime.tracing import tracing_off, tracing_on

# The maintained instrumentations applied, by module and class (the ``otel`` extra has them).
INSTRUMENTATIONS = (
    ("opentelemetry.instrumentation.django", "DjangoInstrumentor"),
    ("opentelemetry.instrumentation.celery", "CeleryInstrumentor"),
    ("opentelemetry.instrumentation.psycopg", "PsycopgInstrumentor"),
    ("opentelemetry.instrumentation.httpx", "HTTPXClientInstrumentor"),
)


def tracing_wanted() -> bool:
    """Whether this process traces (see the module's docstring)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    return bool(settings.OTEL_ENABLED or exporter or endpoint)


def tracing_start(tracer_provider: Any = None) -> Any:
    """Turn tracing on in this process and return its tracer provider: ``tracer_provider`` when
    given (a test's, with an in-memory exporter), else the one the SDK builds from the
    environment (set as the global provider). OpenTelemetry is imported here, by name, and
    nowhere else in the console: an optional dependency (the ``otel`` extra) that a process
    with tracing off never loads."""
    try:
        instrumentors = _instrumentors()
        configurator = importlib.import_module("opentelemetry.distro").OpenTelemetryConfigurator
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"traces are asked for (OTEL_*) but OpenTelemetry is not installed ({exc}): "
            "install the otel extra, pip install 'agent-console[otel]'"
        ) from exc
    if tracer_provider is None:
        # OTLP unless the environment names another exporter (the SDK's own default is none),
        # over HTTP unless it names a protocol: the otel extra ships that exporter (gRPC's
        # needs grpcio, which the image does not carry).
        os.environ.setdefault("OTEL_TRACES_EXPORTER", "otlp")
        os.environ.setdefault("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        os.environ.setdefault("OTEL_SERVICE_NAME", "agent-console")
        configurator().configure()
        tracer_provider = importlib.import_module("opentelemetry.trace").get_tracer_provider()
    conflicts = importlib.import_module("opentelemetry.instrumentation.dependencies")
    for instrumentor in instrumentors:
        # A library this process does not have (httpx is only a team's tools'): nothing to
        # instrument, and no error logged at every start.
        missing = conflicts.get_dependency_conflicts(instrumentor.instrumentation_dependencies())
        if missing is None and not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(tracer_provider=tracer_provider)
    tracing_on(tracer_provider)
    return tracer_provider


def tracing_stop() -> None:
    """Undo ``tracing_start``'s instrumentations (a test's teardown)."""
    tracing_off()
    for instrumentor in _instrumentors():
        if instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()


def _instrumentors() -> list[Any]:
    # Each instrumentor class is a singleton (OpenTelemetry's BaseInstrumentor).
    return [getattr(importlib.import_module(m), name)() for m, name in INSTRUMENTATIONS]

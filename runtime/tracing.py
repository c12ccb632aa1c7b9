"""Spans around the worker's steps (the proposal, the claim, the tool call, the acceptance) and
the trace context that carries an agent's ``traceparent`` from its request to the tool call,
through the outbox row and the message (docs/operations.md#traces).

Off unless the console turned it on (``console.tracing``, at startup, when the environment asks
for traces): until then nothing of OpenTelemetry is imported, every helper is a check of one
module-level flag, and the statements carry an empty payload as before. The console owns the
configuration (exporters, the maintained instrumentations); this module only makes spans with
the tracer it is handed, so the runtime never imports the console."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from types import ModuleType
from typing import Any

# The console's own attributes (the ids a person searches by: operation_id, task_id, ...) are
# named under this prefix.
PREFIX = "console."


class _Tracing:
    """What ``tracing_on`` loaded: the API's modules and the tracer (None while off)."""

    on = False
    tracer: Any = None
    trace: ModuleType | None = None
    propagate: ModuleType | None = None
    context: ModuleType | None = None


_state = _Tracing()
_OFF = nullcontext(None)


def tracing_on(tracer_provider: Any) -> None:
    """Make the runtime's spans with ``tracer_provider``'s tracer. The API's modules are
    imported here, by name (importlib), and nowhere else in the runtime: OpenTelemetry is an
    optional dependency (the ``otel`` extra), and a process with tracing off never loads it."""
    trace = importlib.import_module("opentelemetry.trace")
    _state.trace = trace
    _state.propagate = importlib.import_module("opentelemetry.propagate")
    _state.context = importlib.import_module("opentelemetry.context")
    _state.tracer = trace.get_tracer("agent_console.runtime", tracer_provider=tracer_provider)
    _state.on = True


def tracing_off() -> None:
    _state.on = False
    _state.tracer = None


def tracing_enabled() -> bool:
    return _state.on


def span(name: str, **attributes: Any) -> Any:
    """A context manager around one step: a span named ``name`` (a child of the current one)
    with ``attributes`` (named ``console.<keyword>``; None values left out), yielding it; while
    off, a shared no-op that yields None."""
    if not _state.on:
        return _OFF
    return _started(name, attributes)


def work_span(name: str, lease: Any, **attributes: Any) -> Any:
    """``span`` for a step of the work a lease holds (a ``runtime.transitions.lease.Lease``):
    with its operation's and task's ids, its lease generation and invocation number."""
    if not _state.on:
        return _OFF
    ids = {
        "operation_id": lease.operation_id,
        "task_id": lease.operation.task_id,
        "lease_generation": lease.lease_generation,
        "invocation_number": lease.invocation_number,
    }
    return _started(name, {**ids, **attributes})


@contextmanager
def _started(name: str, attributes: dict[str, Any]) -> Iterator[Any]:
    known = _named(attributes)
    with _state.tracer.start_as_current_span(name, attributes=known) as current:
        yield current


def annotate(current: Any, **attributes: Any) -> None:
    """Add what became known during the step (the operation's id after the proposal)."""
    if current is not None:
        current.set_attributes(_named(attributes))


def _named(attributes: dict[str, Any]) -> dict[str, Any]:
    return {PREFIX + k: v for k, v in attributes.items() if v is not None}


def carrier() -> dict[str, str]:
    """The current trace context as W3C headers (``traceparent``, ``tracestate``), as stored
    with an outbox row and sent with its message; empty while off or outside any span."""
    if not _state.on:
        return {}
    headers: dict[str, str] = {}
    assert _state.propagate is not None
    _state.propagate.inject(headers)
    return headers


def inject(headers: dict[str, str]) -> None:
    """Add the current trace context to an outgoing request's ``headers`` (a tool's call)."""
    if _state.on:
        assert _state.propagate is not None
        _state.propagate.inject(headers)


def has_current() -> bool:
    """Whether a span is current (a delivery whose message carried its trace: Celery's run
    span), so the stored context need not be read."""
    if not _state.on:
        return False
    assert _state.trace is not None
    return bool(_state.trace.get_current_span().get_span_context().is_valid)


def continued(stored: dict[str, Any] | None) -> Any:
    """A context manager under which ``stored`` (a ``carrier()``, as an outbox row keeps it) is
    the current trace context; a no-op while off or when nothing was stored."""
    if not _state.on or not stored or "traceparent" not in stored:
        return _OFF
    return _attached(stored)


@contextmanager
def _attached(stored: dict[str, Any]) -> Iterator[None]:
    assert _state.propagate is not None and _state.context is not None
    token = _state.context.attach(_state.propagate.extract(stored))
    try:
        yield None
    finally:
        _state.context.detach(token)

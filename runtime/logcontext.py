"""The ids a log line about a piece of work carries: ``task_id``, ``attempt_id``,
``operation_id`` and ``execution_id``, bound in context variables (structlog's) where a worker
runs an operation and where the web handles an operation's route, and the ``request_id`` of the
web request that caused the work (bound by the web for the request, and by the worker for the
delivery a request's message caused). Every log record emitted meanwhile, by any logger, carries
them: as JSON fields with ``LOG_FORMAT=json``, appended as ``key=value`` to the human-readable
line otherwise (console.logformat).

Each journal event, once its transaction commits, is one INFO line on the ``runtime.journal``
logger (``transition_log``): the event's type, and the task, attempt, operation, execution and
lease generation it is about, and its actor, as fields of the record (a field the event does
not know is taken from what is bound)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from structlog.contextvars import (
    bind_contextvars,
    bound_contextvars,
    clear_contextvars,
    get_contextvars,
    unbind_contextvars,
)

WORK_IDS = ("task_id", "attempt_id", "operation_id", "execution_id")
REQUEST_ID = "request_id"
# The fields a transition's line names beside the bound ids, and every field a line may carry.
TRANSITION_FIELDS = ("transition", "lease_generation", "approval_id", "actor", "from", "to")
LOG_FIELDS = (REQUEST_ID, *WORK_IDS, *TRANSITION_FIELDS)

journal_log = logging.getLogger("runtime.journal")


def _ids(op: Any = None, **ids: Any) -> dict[str, str]:
    found: dict[str, Any] = {}
    if op is not None:
        found = {"task_id": op.task_id, "attempt_id": op.attempt_id, "operation_id": op.pk}
    found.update(ids)
    return {k: str(v) for k, v in found.items() if k in WORK_IDS and v}


@contextmanager
def work_bound(op: Any = None, **ids: Any) -> Iterator[None]:
    """Within the block, log records carry the ids of ``op`` (an Operation: its task, attempt
    and own id) and the ``ids`` given (``execution_id``...); the earlier values come back after."""
    with bound_contextvars(**_ids(op, **ids)):
        yield


def work_bind(op: Any = None, **ids: Any) -> None:
    """Bind the ids for the rest of the current context (a request: cleared at its end)."""
    bind_contextvars(**_ids(op, **ids))


def work_clear() -> None:
    clear_contextvars()


def work_unbind() -> None:
    """Unbind the work's ids (a request's other bindings, its id, stay)."""
    unbind_contextvars(*WORK_IDS)


def request_bind(request_id: str) -> None:
    """Bind the request id for the rest of the current context (a request, a delivery)."""
    bind_contextvars(**{REQUEST_ID: request_id})


def request_unbind() -> None:
    unbind_contextvars(REQUEST_ID)


def request_id_current() -> str | None:
    """The request id bound in this context, if any: what a message published now carries."""
    found = get_contextvars().get(REQUEST_ID)
    return str(found) if found else None


def transition_fields(
    event_type: str,
    *,
    task_id: str,
    actor: str,
    op: Any = None,
    operation_id: str | None = None,
    data: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The fields of a journal event's line, taken now (``op`` is mutated after the event):
    ``op`` (an Operation as the event left it) names its attempt, execution and lease
    generation; the event's ``data`` may name the generation, execution and approval."""
    data = data or {}
    fields: dict[str, Any] = {"transition": event_type, "task_id": task_id, "actor": actor}
    if op is not None:
        fields.update(
            operation_id=op.pk,
            attempt_id=op.attempt_id,
            execution_id=op.execution_id,
            lease_generation=op.lease_generation,
        )
    elif operation_id:
        fields["operation_id"] = operation_id
    named = {
        "lease_generation": data.get("lease_generation"),
        "execution_id": data.get("execution"),
        "approval_id": data.get("approval"),
        "from": data.get("from"),
        "to": data.get("to"),
    }
    fields.update({k: v for k, v in named.items() if v is not None and v != ""})
    return {k: v for k, v in fields.items() if v is not None and v != ""}


def transition_log(fields: Mapping[str, Any]) -> None:
    """One INFO line for a committed journal event (``fields``: ``transition_fields``)."""
    journal_log.info("%s", fields["transition"], extra=dict(fields))

"""The ids a log line about a piece of work carries: ``task_id``, ``attempt_id``,
``operation_id`` and ``execution_id``, bound in context variables (structlog's) where a worker
runs an operation and where the web handles an operation's route. Every log record emitted
meanwhile, by any logger, carries them: as JSON fields with ``LOG_FORMAT=json``, appended as
``key=value`` to the human-readable line otherwise (console.logformat)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from structlog.contextvars import bind_contextvars, bound_contextvars, clear_contextvars

WORK_IDS = ("task_id", "attempt_id", "operation_id", "execution_id")


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
